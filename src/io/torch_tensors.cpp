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

at::ScalarType parse_run_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16") return at::kHalf;
  DP_FAIL("unknown dtype '", name, "' (expected fp32, bf16 or fp16)");
}

std::string run_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    default: return c10::toString(dtype);
  }
}

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
