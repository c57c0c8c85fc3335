#pragma once
// Raw-pointer launcher of the VAE's GroupNorm kernels (group_norm_kernels.cu), without ATen like the FLUX kernels;
// models/vae/vae_blocks.cpp checks shapes and layout before calling it.
#include <cstdint>

#include <cuda_runtime_api.h>

#include "models/cuda/element_type.h"

namespace dp::models::vae::kernels {

using ElementType = gpu::ElementType;

// A contiguous (batch, channels, spatial...) tensor, its spatial extent flattened, normalised in `groups` groups
// of consecutive channels.
struct GroupNormShape {
  int64_t batch = 0, channels = 0, spatial = 0, groups = 0;
};

// How many floats of device workspace group_norm needs for `shape` (each group's partial and final statistics).
int64_t group_norm_workspace_floats(ElementType type, const GroupNormShape& shape);

// out = GroupNorm(x) with per-channel gamma and beta, as ATen's kernel computes it: each group's mean and biased
// variance in fp32 (here from partial statistics of many blocks, combined in double), rstd = rsqrt(var + eps),
// both stored in the storage type as ATen stores them, then out = x * a + b with a = rstd * gamma[c] and
// b = beta[c] - a * mean in fp32, rounded to the storage type. With
// `silu` that rounded value goes through SiLU in fp32 and is rounded again, as the two ATen ops would give.
void group_norm(ElementType type, const void* x, const void* gamma, const void* beta, const GroupNormShape& shape,
                float eps, bool silu, float* workspace, void* out, cudaStream_t stream);

}  // namespace dp::models::vae::kernels
