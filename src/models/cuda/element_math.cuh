#pragma once
// Device helpers the project's kernels share: conversions between the storage types and fp32, the rounding an
// ATen op producing a tensor of that type applies, 16-byte packs, warp reductions, and the host-side dispatch on
// ElementType. nvcc only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "models/cuda/element_type.h"

namespace dp::models::gpu {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// The value a PyTorch op producing a T tensor would have stored.
template <typename T>
__device__ __forceinline__ float rounded(float x) { return to_float(from_float<T>(x)); }

// V consecutive elements moved as one 16-byte (or smaller) memory transaction.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

inline bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Calls f(T{}) with the CUDA type of `type`.
template <typename F>
void with_type(ElementType type, F&& f) {
  switch (type) {
    case ElementType::F32: f(float{}); break;
    case ElementType::F16: f(__half{}); break;
    case ElementType::BF16: f(__nv_bfloat16{}); break;
  }
}

}  // namespace dp::models::gpu
