#include "io/run_dtype.h"

#include "core/error.h"

namespace dp::io {

DType parse_run_dtype(const std::string& name, const std::string& what) {
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp16" || name == "float16") return DType::F16;
  if (name == "fp32" || name == "float32") return DType::F32;
  DP_FAIL(what, " '", name, "' is not a run dtype (expected bf16, fp16 or fp32; bfloat16, float16, float32 also work)");
}

std::string run_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::F32: return "fp32";
    default: DP_FAIL("dtype ", dtype_name(dtype), " is not a run dtype (bf16, fp16 or fp32)");
  }
}

}  // namespace dp::io
