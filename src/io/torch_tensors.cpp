#include "io/torch_tensors.h"

#include <cstring>

#include "core/error.h"

namespace dp::io {

at::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::F64: return at::kDouble;
    case DType::F32: return at::kFloat;
    case DType::F16: return at::kHalf;
    case DType::BF16: return at::kBFloat16;
    case DType::I64: return at::kLong;
    case DType::I32: return at::kInt;
    case DType::I16: return at::kShort;
    case DType::I8: return at::kChar;
    case DType::U8: return at::kByte;
    case DType::BOOL: return at::kBool;
    case DType::U16: return at::kUInt16;
    case DType::U32: return at::kUInt32;
    case DType::U64: return at::kUInt64;
  }
  DP_FAIL("unhandled safetensors dtype");
}

at::ScalarType parse_run_scalar_type(const std::string& name, const std::string& what) {
  return to_scalar_type(parse_run_dtype(name, what));
}

std::string run_dtype_name(at::ScalarType dtype) { return run_dtype_name(to_safetensors_dtype(dtype)); }

at::Tensor tensor_view(const std::shared_ptr<SafetensorsFile>& file, const TensorInfo& info) {
  const auto options = at::TensorOptions().dtype(to_scalar_type(info.dtype));
  const std::byte* bytes = file->data(info);
  const auto alignment = dtype_size(info.dtype);
  if (info.nbytes() == 0) return at::empty(info.shape, options);
  if (reinterpret_cast<uintptr_t>(bytes) % alignment == 0) {
    // The deleter holds the mapping alive as long as any view of it exists.
    auto keep_alive = new std::shared_ptr<SafetensorsFile>(file);
    return at::from_blob(
        const_cast<std::byte*>(bytes), info.shape,
        [keep_alive](void*) { delete keep_alive; }, options);
  }
  at::Tensor copy = at::empty(info.shape, options);
  std::memcpy(copy.data_ptr(), bytes, info.nbytes());
  return copy;
}

at::Tensor load_tensor(const WeightIndex& weights, const std::string& name, at::ScalarType dtype,
                       const at::Device& device) {
  const TensorInfo& info = weights.info(name);
  at::Tensor tensor = tensor_view(weights.mapped_file(name), info);
  if (tensor.scalar_type() == dtype && device.is_cpu()) return tensor;
  return tensor.to(device, dtype);
}

}  // namespace dp::io

#include "io/safetensors_writer.h"

namespace dp::io {

DType to_safetensors_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return DType::F64;
    case at::kFloat: return DType::F32;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kLong: return DType::I64;
    case at::kInt: return DType::I32;
    case at::kShort: return DType::I16;
    case at::kChar: return DType::I8;
    case at::kByte: return DType::U8;
    case at::kBool: return DType::BOOL;
    default: DP_FAIL("cannot store tensors of dtype ", c10::toString(dtype), " in safetensors");
  }
}

void save_tensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors) {
  SafetensorsWriter writer;
  std::vector<at::Tensor> contiguous;
  for (const auto& [name, tensor] : tensors) {
    contiguous.push_back(tensor.detach().to(at::kCPU).contiguous());
    writer.add(name, to_safetensors_dtype(tensor.scalar_type()), contiguous.back().sizes().vec());
  }
  writer.write(path, [&](std::size_t i, void* out, uint64_t n) { std::memcpy(out, contiguous[i].data_ptr(), n); });
}

}  // namespace dp::io
