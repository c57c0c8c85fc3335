#pragma once
// Turning validated safetensors entries into LibTorch tensors.
#include <ATen/ATen.h>

#include <map>
#include <string>

#include "io/run_dtype.h"
#include "io/safetensors.h"
#include "io/weight_index.h"

namespace dp::io {

at::ScalarType to_scalar_type(DType dtype);
// io/run_dtype's parser and canonical names, for LibTorch's dtypes.
at::ScalarType parse_run_scalar_type(const std::string& name, const std::string& what = "--dtype");
std::string run_dtype_name(at::ScalarType dtype);

// A tensor viewing the mapped bytes when they are aligned for the element type (the file stays mapped
// while the tensor lives), otherwise a copy. No dtype conversion.
at::Tensor tensor_view(const std::shared_ptr<SafetensorsFile>& file, const TensorInfo& info);

// Loads `name` converted to `dtype` on `device`. Zero-copy when no conversion or transfer is needed.
at::Tensor load_tensor(const WeightIndex& weights, const std::string& name, at::ScalarType dtype,
                       const at::Device& device = at::kCPU);

}  // namespace dp::io

namespace dp::io {
// Writes CPU copies of `tensors` to a safetensors file (name order), atomically.
void save_tensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors);
DType to_safetensors_dtype(at::ScalarType dtype);
}  // namespace dp::io
