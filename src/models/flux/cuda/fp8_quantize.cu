// One block per row: the row's largest magnitude, then the row divided by its scale and rounded to e4m3.
// The division is IEEE (__fdiv_rn) so the result is the ATen composition's, value for value. A row may be the
// concatenation of two matrices' rows, either through a GELU: the single block's [attention | gelu(mlp)] and
// the MLP's gelu(hidden) are quantised without being written out in bf16 first.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "models/flux/cuda/fp8_quantize.h"
#include "models/flux/cuda/gelu_tanh.cuh"

namespace dp::models::flux::kernels {
namespace {

constexpr float kFp8Max = 448.0f;

__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float as_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float stored(float x, float) { return x; }
__device__ __forceinline__ float stored(float x, __half) { return __half2float(__float2half_rn(x)); }
__device__ __forceinline__ float stored(float x, __nv_bfloat16) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ float block_max(float x, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// V elements read as one transaction and written as V bytes.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <int V>
struct alignas(V) Bytes {
  __nv_fp8_e4m3 v[V];
};

// The V values of pack i of the row (the segments' columns are multiples of V).
template <typename T, int V>
__device__ __forceinline__ void row_pack(const Fp8Segment& first, const Fp8Segment& second, int64_t row, int64_t i,
                                         float (&out)[V]) {
  const bool in_first = i * V < first.columns;
  const Fp8Segment& s = in_first ? first : second;
  const int64_t column = in_first ? i * V : i * V - first.columns;
  const T* start = static_cast<const T*>(s.data) + row * s.row_stride + column;
  const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(start);
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const float x = as_float(pack.v[e]);
    out[e] = s.gelu_tanh ? stored(gelu_tanh_value(x), T{}) : x;
  }
}

template <typename T, int V>
__global__ void quantize_rows_kernel(Fp8Segment first, Fp8Segment second, __nv_fp8_e4m3* out, float* scales) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t columns = first.columns + second.columns, packs = columns / V;
  float largest = 0.0f;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    float values[V];
    row_pack<T, V>(first, second, row, i, values);
#pragma unroll
    for (int e = 0; e < V; ++e) largest = fmaxf(largest, fabsf(values[e]));
  }
  const float scale = __fdiv_rn(fmaxf(block_max(largest, scratch), 1e-12f), kFp8Max);
  if (threadIdx.x == 0) scales[row] = scale;
  auto* dst = reinterpret_cast<Bytes<V>*>(out + row * columns);
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    float values[V];
    row_pack<T, V>(first, second, row, i, values);
    Bytes<V> result;
#pragma unroll
    for (int e = 0; e < V; ++e) result.v[e] = __nv_fp8_e4m3(__fdiv_rn(values[e], scale));
    dst[i] = result;
  }
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

bool vectorisable(const Fp8Segment& s, int64_t element_bytes, int wide) {
  return s.columns == 0 ||
         (s.columns % wide == 0 && s.row_stride % wide == 0 && aligned(s.data, element_bytes * wide));
}

}  // namespace

void quantize_rows_fp8(ElementType type, const Fp8Segment& first, const Fp8Segment& second, int64_t rows, void* out,
                       float* scales, cudaStream_t stream) {
  const int64_t columns = first.columns + second.columns;
  if (rows == 0 || columns == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    constexpr int kWide = 8;
    const bool vector = vectorisable(first, sizeof(T), kWide) && vectorisable(second, sizeof(T), kWide) &&
                        aligned(out, kWide);
    const int64_t packs = vector ? columns / kWide : columns;
    const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (packs + 31) / 32 * 32)));
    auto* bytes = static_cast<__nv_fp8_e4m3*>(out);
    if (vector)
      quantize_rows_kernel<T, kWide><<<static_cast<unsigned>(rows), threads, 0, stream>>>(first, second, bytes, scales);
    else
      quantize_rows_kernel<T, 1><<<static_cast<unsigned>(rows), threads, 0, stream>>>(first, second, bytes, scales);
  };
  switch (type) {
    case ElementType::F32: run(float{}); break;
    case ElementType::F16: run(__half{}); break;
    case ElementType::BF16: run(__nv_bfloat16{}); break;
  }
}

}  // namespace dp::models::flux::kernels
