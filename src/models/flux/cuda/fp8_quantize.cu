// One block per row: the row's largest magnitude, then the row divided by its scale and rounded to e4m3.
// The codes are the ATen composition's (an IEEE division, then the cast), value for value: see quotient(). A row
// may be the concatenation of two matrices' rows, either through a GELU: the single block's [attention |
// gelu(mlp)] and the MLP's gelu(hidden) are quantised without being written out in bf16 first.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "models/cuda/element_math.cuh"
#include "models/flux/cuda/fp8_quantize.h"
#include "models/flux/cuda/gelu_tanh.cuh"

namespace dp::models::flux::kernels {
namespace {

using gpu::Pack;
using gpu::rounded;
using gpu::to_float;
using gpu::with_type;

constexpr float kFp8Max = 448.0f;
// The dynamic shared memory a launch may take without opting in: 48 KB less the static block_max scratch (a bf16
// row of up to 24448 columns; FLUX's widest, [attention | mlp], has 15360).
constexpr size_t kRowCacheBytes = 48 * 1024 - 32 * sizeof(float);

__device__ float block_max(float x, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// The IEEE quotient x / scale without a division: with the reciprocal correctly rounded, the product corrected
// once by its exact residual (two FMAs) is the correctly rounded quotient (Markstein's theorem), outside underflow,
// where the code is 0 either way; the sign is x's, so that -0 stays -0 as x / scale keeps it. A row whose largest
// magnitude is infinite (reciprocal 0) divides, as ATen does, for its NaNs and zeros. The same arithmetic on the
// host is checked against the IEEE division in models_fp8_gemm_test (Fp8Quotient), the codes against ATen on CUDA.
__device__ __forceinline__ float quotient(float x, float scale, float reciprocal) {
  if (reciprocal == 0.0f) return __fdiv_rn(x, scale);
  const float product = __fmul_rn(x, reciprocal);
  const float residual = fmaf(-product, scale, x);
  return copysignf(fmaf(residual, reciprocal, product), x);
}

// V bytes written as one transaction.
template <int V>
struct alignas(V) Bytes {
  __nv_fp8_e4m3 v[V];
};

// The V values of pack i of the row (the segments' columns are multiples of V). The segment is picked by value,
// not by a reference to one of the two kernel parameters, which would copy both to local memory.
template <typename T, int V>
__device__ __forceinline__ void row_pack(const Fp8Segment& first, const Fp8Segment& second, int64_t row, int i,
                                         float (&out)[V]) {
  const bool in_first = i * V < first.columns;
  const T* start = in_first
                       ? static_cast<const T*>(first.data) + row * first.row_stride + i * V
                       : static_cast<const T*>(second.data) + row * second.row_stride + (i * V - first.columns);
  const bool gelu = in_first ? first.gelu_tanh : second.gelu_tanh;
  const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(start);
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const float x = to_float(pack.v[e]);
    out[e] = gelu ? rounded<T>(gelu_tanh_value(x)) : x;
  }
}

// With kCached, the first pass keeps the row (after its GELU, rounded to T as rounded() already does, so exactly)
// in shared memory and the second reads it there: each element is read from global memory and through the tanh
// once. Without (rows too wide for 48 KB), the second pass reads and evaluates the row again.
template <typename T, int V, bool kCached>
__global__ void quantize_rows_kernel(Fp8Segment first, Fp8Segment second, __nv_fp8_e4m3* out, float* scales) {
  __shared__ float scratch[32];
  extern __shared__ __align__(16) unsigned char row_cache_bytes[];
  auto* cache = reinterpret_cast<Pack<T, V>*>(row_cache_bytes);
  const int64_t row = blockIdx.x;
  const int columns = static_cast<int>(first.columns + second.columns), packs = columns / V;
  float largest = 0.0f;
  for (int i = threadIdx.x; i < packs; i += blockDim.x) {
    float values[V];
    row_pack<T, V>(first, second, row, i, values);
    Pack<T, V> kept;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      largest = fmaxf(largest, fabsf(values[e]));
      if constexpr (kCached) kept.v[e] = static_cast<T>(values[e]);
    }
    if constexpr (kCached) cache[i] = kept;
  }
  // block_max's __syncthreads also orders the cache's writes before its reads.
  const float scale = __fdiv_rn(fmaxf(block_max(largest, scratch), 1e-12f), kFp8Max);
  const float reciprocal = __frcp_rn(scale);
  if (threadIdx.x == 0) scales[row] = scale;
  auto* dst = reinterpret_cast<Bytes<V>*>(out + row * columns);
  for (int i = threadIdx.x; i < packs; i += blockDim.x) {
    float values[V];
    if constexpr (kCached) {
      const Pack<T, V> kept = cache[i];
#pragma unroll
      for (int e = 0; e < V; ++e) values[e] = to_float(kept.v[e]);
    } else {
      row_pack<T, V>(first, second, row, i, values);
    }
    Bytes<V> result;
#pragma unroll
    for (int e = 0; e < V; ++e) result.v[e] = __nv_fp8_e4m3(quotient(values[e], scale, reciprocal));
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
    const auto blocks = static_cast<unsigned>(rows);
    const size_t row_bytes = static_cast<size_t>(columns) * sizeof(T);
    if (row_bytes > kRowCacheBytes) {
      if (vector)
        quantize_rows_kernel<T, kWide, false><<<blocks, threads, 0, stream>>>(first, second, bytes, scales);
      else
        quantize_rows_kernel<T, 1, false><<<blocks, threads, 0, stream>>>(first, second, bytes, scales);
    } else if (vector) {
      quantize_rows_kernel<T, kWide, true><<<blocks, threads, row_bytes, stream>>>(first, second, bytes, scales);
    } else {
      quantize_rows_kernel<T, 1, true><<<blocks, threads, row_bytes, stream>>>(first, second, bytes, scales);
    }
  };
  with_type(type, run);
}

}  // namespace dp::models::flux::kernels
