#include "io/run_dtype.h"

#include "core/error.h"

namespace dp::io {

DType parse_run_dtype(const std::string& given, const std::string& what) {
  // diffusers' scripts spell it torch_dtype=torch.bfloat16: "torch.bfloat16" is accepted as it is written there.
  const std::string name = given.rfind("torch.", 0) == 0 ? given.substr(6) : given;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::F16;
  if (name == "fp32" || name == "float32" || name == "float") return DType::F32;
  DP_FAIL(what, " '", given, "' is not a run dtype (expected bf16, fp16 or fp32; bfloat16, float16, float32 and "
          "torch.bfloat16, torch.float16, torch.float32 also work)");
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
