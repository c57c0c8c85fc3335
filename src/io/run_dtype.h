#pragma once
// The dtypes a run computes in, as the user names them (--dtype, run configs) and as reports spell them.
// One parser for every command: bf16|bfloat16, fp16|float16, fp32|float32; canonical names bf16, fp16, fp32.
#include <string>

#include "io/safetensors.h"

namespace dp::io {

// Throws naming `what` (the flag or config key), the value and the accepted spellings.
DType parse_run_dtype(const std::string& name, const std::string& what = "--dtype");
// The canonical spelling ("bf16", "fp16", "fp32"); throws for a dtype that is not a run dtype.
std::string run_dtype_name(DType dtype);

}  // namespace dp::io
