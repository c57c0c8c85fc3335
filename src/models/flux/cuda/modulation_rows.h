#pragma once
// Raw-pointer launcher of the modulation rows' projection (modulation_rows.cu); no ATen here, so nvcc never
// parses LibTorch headers. flux_modulation.cpp checks shapes, dtypes and devices before calling it.
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "models/cuda/element_type.h"

namespace dp::models::flux::kernels {

// out (rows, out_features) = x (rows, in_features) @ weight (out_features, in_features)^T + bias, all contiguous;
// bias may be null. fp32 accumulation, one rounding to the storage type, as cuBLAS with a bias epilogue does.
// Each row of out depends on its own row of x only, summed in an order fixed by in_features alone: a row comes
// out bit for bit the same whatever `rows` is, so rows computed for a whole schedule at once equal the ones
// computed a step at a time (on another rank, or for a block whose weights stream in per step).
void modulation_rows(gpu::ElementType type, const void* x, const void* weight, const void* bias, int64_t rows,
                     int64_t out_features, int64_t in_features, void* out, cudaStream_t stream);

// How the work is cut: `features` output features a warp, `rows_per_block` rows of x a block. The cut changes
// the speed only, never the sums: every shape gives the same bits.
struct ModulationRowsShape {
  int features;
  int rows_per_block;
};
// The shapes there are kernels for, and the one modulation_rows takes for `rows` rows.
std::vector<ModulationRowsShape> modulation_rows_shapes();
ModulationRowsShape modulation_rows_shape(int64_t rows);
// modulation_rows with a given shape (one of modulation_rows_shapes()): for the bench, which times them against
// each other, and the test that holds them to the same bits.
void modulation_rows_shaped(ModulationRowsShape shape, gpu::ElementType type, const void* x, const void* weight,
                            const void* bias, int64_t rows, int64_t out_features, int64_t in_features, void* out,
                            cudaStream_t stream);

}  // namespace dp::models::flux::kernels
