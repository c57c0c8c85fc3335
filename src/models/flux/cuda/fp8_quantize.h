#pragma once
// Raw-pointer launcher of the FP8 row quantiser (fp8_quantize.cu), without ATen like the other kernels here;
// models/flux/fp8_gemm.cpp checks shapes and strides before calling it.
#include <cstdint>

#include <cuda_runtime_api.h>

#include "models/flux/cuda/flux_fused_kernels.h"

namespace dp::models::flux::kernels {

// For each of `rows` rows of `columns` elements (`row_stride` elements apart): scales[r] = max(|row|, 1e-12) /
// 448 (FP8 e4m3's largest finite value) and out[r] = e4m3(row / scales[r]), rounded to nearest. `out` is
// contiguous (rows, columns) bytes, `scales` rows floats.
void quantize_rows_fp8(ElementType type, const void* x, int64_t rows, int64_t columns, int64_t row_stride,
                       void* out, float* scales, cudaStream_t stream);

}  // namespace dp::models::flux::kernels
