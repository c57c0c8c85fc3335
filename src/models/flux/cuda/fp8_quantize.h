#pragma once
// Raw-pointer launcher of the FP8 row quantiser (fp8_quantize.cu), without ATen like the other kernels here;
// models/flux/fp8_gemm.cpp checks shapes and strides before calling it.
#include <cstdint>

#include <cuda_runtime_api.h>

#include "models/flux/cuda/flux_fused_kernels.h"

namespace dp::models::flux::kernels {

// Columns of a row-major matrix, `row_stride` elements from one row to the next; with `gelu_tanh` each element
// passes through the tanh GELU and is rounded to the storage type first, as a GELU tensor would have been.
struct Fp8Segment {
  const void* data = nullptr;
  int64_t columns = 0;
  int64_t row_stride = 0;
  bool gelu_tanh = false;
};

// Each of `rows` rows is [first | second] (second may have no columns): scales[r] = max(|row|, 1e-12) / 448
// (FP8 e4m3's largest finite value) and out[r] = e4m3(row / scales[r]), rounded to nearest. `out` is contiguous
// (rows, first.columns + second.columns) bytes, `scales` rows floats.
void quantize_rows_fp8(ElementType type, const Fp8Segment& first, const Fp8Segment& second, int64_t rows, void* out,
                       float* scales, cudaStream_t stream);

}  // namespace dp::models::flux::kernels
