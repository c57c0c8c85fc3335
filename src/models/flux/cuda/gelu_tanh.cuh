#pragma once
// torch.nn.functional.gelu(approximate="tanh") in fp32, the formula ATen's CUDA kernel evaluates; shared by
// the fused GELU kernel and the FP8 quantiser, which must give the same values.
#include <cuda_runtime.h>

namespace dp::models::flux::kernels {

__device__ __forceinline__ float gelu_tanh_value(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float cube = x * x * x;
  const float inner = kBeta * (x + kKappa * cube);
  return 0.5f * x * (1.0f + tanhf(inner));
}

}  // namespace dp::models::flux::kernels
