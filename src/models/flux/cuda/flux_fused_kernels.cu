// Fused FLUX block kernels. Each replaces a chain of ATen elementwise launches (several of them strided or
// mixing bf16 with fp32, which ATen runs on its slow non-vectorised path) with one pass over memory.
// Rounding points follow diffusers' eager code: a value is rounded to the storage type wherever PyTorch
// would have materialised a bf16/fp16 tensor. __fmul_rn/__fadd_rn keep nvcc from contracting those
// products into FMAs, which would round differently from the separate ATen ops.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "models/cuda/element_math.cuh"
#include "models/flux/cuda/flux_fused_kernels.h"
#include "models/flux/cuda/gelu_tanh.cuh"

namespace dp::models::flux::kernels {
namespace {

using gpu::aligned;
using gpu::from_float;
using gpu::Pack;
using gpu::rounded;
using gpu::to_float;
using gpu::warp_sum;
using gpu::with_type;

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  x = warp_sum(x);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(x);
}

constexpr int kMaxPairsPerLane = 4;  // head_dim up to 256

template <typename T>
__global__ void qk_norm_rope_kernel(RowView qkv, const T* norm_q, const T* norm_k, const float* cos,
                                    const float* sin, float eps, QkvLayout layout, T* q, T* k, T* v) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t per_tensor = layout.batch * layout.tokens * layout.heads;
  if (warp >= 3 * per_tensor) return;
  const int which = static_cast<int>(warp / per_tensor);  // 0: q, 1: k, 2: v
  int64_t rest = warp % per_tensor;
  const int64_t head = rest % layout.heads;
  rest /= layout.heads;
  const int64_t token = rest % layout.tokens;
  const int64_t b = rest / layout.tokens;
  const int64_t dim = layout.head_dim, pairs = dim / 2;
  const T* src = static_cast<const T*>(qkv.data) + b * qkv.batch_stride + token * qkv.row_stride +
                 (which * layout.heads + head) * dim;
  const int64_t out_token = layout.token_offset + token;
  T* dst = (which == 0 ? q : which == 1 ? k : v) + ((b * layout.total_tokens + out_token) * layout.heads + head) * dim;
  using Pair = Pack<T, 2>;
  const Pair* src_pairs = reinterpret_cast<const Pair*>(src);
  Pair* dst_pairs = reinterpret_cast<Pair*>(dst);
  if (which == 2) {
    for (int64_t p = lane; p < pairs; p += 32) dst_pairs[p] = src_pairs[p];
    return;
  }
  float even[kMaxPairsPerLane], odd[kMaxPairsPerLane];
  float squares = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int64_t p = lane + 32 * j;
    even[j] = odd[j] = 0.0f;
    if (p < pairs) {
      const Pair pair = src_pairs[p];
      even[j] = to_float(pair.v[0]);
      odd[j] = to_float(pair.v[1]);
      squares += even[j] * even[j] + odd[j] * odd[j];
    }
  }
  const float mean_square = warp_sum(squares) * (1.0f / static_cast<float>(dim));
  const float inv_rms = rsqrtf(mean_square + eps);
  const T* weight = which == 0 ? norm_q : norm_k;
  const float* cos_row = cos + out_token * dim;
  const float* sin_row = sin + out_token * dim;
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int64_t p = lane + 32 * j;
    if (p >= pairs) continue;
    const int64_t e = 2 * p;
    // RMSNorm: x * rsqrt(mean(x^2) + eps) rounded, then times the weight rounded.
    const float n0 = rounded<T>(__fmul_rn(rounded<T>(__fmul_rn(even[j], inv_rms)), to_float(weight[e])));
    const float n1 = rounded<T>(__fmul_rn(rounded<T>(__fmul_rn(odd[j], inv_rms)), to_float(weight[e + 1])));
    // apply_rotary_emb: x * cos + (-x_imag, x_real) * sin, in fp32.
    Pair out;
    out.v[0] = from_float<T>(__fadd_rn(__fmul_rn(n0, cos_row[e]), __fmul_rn(-n1, sin_row[e])));
    out.v[1] = from_float<T>(__fadd_rn(__fmul_rn(n1, cos_row[e + 1]), __fmul_rn(n0, sin_row[e + 1])));
    dst_pairs[p] = out;
  }
}

// The same computation with 16-byte loads and stores: one row of `qkv` per blockIdx.x, each head spread
// over `lanes` consecutive threads (a power of two up to 32) holding V elements each. The warp-per-head
// kernel above moves 4 bytes per lane and spends most of its time on index arithmetic.
template <typename T>
__global__ void qk_norm_rope_wide_kernel(RowView qkv, const T* norm_q, const T* norm_k, const float* cos,
                                         const float* sin, float eps, QkvLayout layout, int lanes, T* q, T* k,
                                         T* v) {
  constexpr int V = 16 / sizeof(T);
  using P = Pack<T, V>;
  const int thread = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  const int head_column = thread / lanes;  // which of the 3 * heads heads of the row
  const int part = thread % lanes;
  const int heads = static_cast<int>(layout.heads);
  if (head_column >= 3 * heads) return;  // whole groups of `lanes` threads leave together
  const int which = head_column / heads;  // 0: q, 1: k, 2: v
  const int head = head_column - which * heads;
  const int64_t row = blockIdx.x, b = row / layout.tokens, token = row - b * layout.tokens;
  const int64_t dim = layout.head_dim, first = static_cast<int64_t>(part) * V;
  const T* src = static_cast<const T*>(qkv.data) + b * qkv.batch_stride + token * qkv.row_stride +
                 head_column * dim + first;
  const int64_t out_token = layout.token_offset + token;
  T* dst = (which == 0 ? q : which == 1 ? k : v) + ((b * layout.total_tokens + out_token) * heads + head) * dim + first;
  const P in = *reinterpret_cast<const P*>(src);
  if (which == 2) {
    *reinterpret_cast<P*>(dst) = in;
    return;
  }
  float x[V];
  float squares = 0.0f;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    x[e] = to_float(in.v[e]);
    squares += x[e] * x[e];
  }
  // Only the head's own group takes part: a warp may hold k heads and v heads, and v has already left.
  const int lane = static_cast<int>(threadIdx.x % 32);
  const unsigned group = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << (lane & ~(lanes - 1));
  for (int offset = lanes / 2; offset > 0; offset /= 2) squares += __shfl_xor_sync(group, squares, offset);
  const float inv_rms = rsqrtf(squares * (1.0f / static_cast<float>(dim)) + eps);
  const P weight = *reinterpret_cast<const P*>((which == 0 ? norm_q : norm_k) + first);
  float cos_row[V], sin_row[V];
#pragma unroll
  for (int e = 0; e < V; e += 4) {
    const float4 c = *reinterpret_cast<const float4*>(cos + out_token * dim + first + e);
    const float4 s = *reinterpret_cast<const float4*>(sin + out_token * dim + first + e);
    cos_row[e] = c.x, cos_row[e + 1] = c.y, cos_row[e + 2] = c.z, cos_row[e + 3] = c.w;
    sin_row[e] = s.x, sin_row[e + 1] = s.y, sin_row[e + 2] = s.z, sin_row[e + 3] = s.w;
  }
  P out;
#pragma unroll
  for (int e = 0; e < V; e += 2) {
    const float n0 = rounded<T>(__fmul_rn(rounded<T>(__fmul_rn(x[e], inv_rms)), to_float(weight.v[e])));
    const float n1 = rounded<T>(__fmul_rn(rounded<T>(__fmul_rn(x[e + 1], inv_rms)), to_float(weight.v[e + 1])));
    out.v[e] = from_float<T>(__fadd_rn(__fmul_rn(n0, cos_row[e]), __fmul_rn(-n1, sin_row[e])));
    out.v[e + 1] = from_float<T>(__fadd_rn(__fmul_rn(n1, cos_row[e + 1]), __fmul_rn(n0, sin_row[e + 1])));
  }
  *reinterpret_cast<P*>(dst) = out;
}

template <typename T, int V>
__global__ void layer_norm_modulate_kernel(const T* x, const T* shift, const T* scale, int64_t modulation_stride,
                                           int64_t tokens, int64_t dim, float eps, T* out) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t b = row / tokens;
  using P = Pack<T, V>;
  const P* in = reinterpret_cast<const P*>(x + row * dim);
  const int64_t packs = dim / V;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const P pack = in[i];
#pragma unroll
    for (int e = 0; e < V; ++e) sum += to_float(pack.v[e]);
  }
  const float mean = block_sum(sum, scratch) / static_cast<float>(dim);
  float deviations = 0.0f;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const P pack = in[i];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = to_float(pack.v[e]) - mean;
      deviations += d * d;
    }
  }
  const float inv_std = rsqrtf(block_sum(deviations, scratch) / static_cast<float>(dim) + eps);
  const P* shift_row = reinterpret_cast<const P*>(shift + b * modulation_stride);
  const P* scale_row = reinterpret_cast<const P*>(scale + b * modulation_stride);
  P* dst = reinterpret_cast<P*>(out + row * dim);
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const P pack = in[i], sh = shift_row[i], sc = scale_row[i];
    P result;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float normed = rounded<T>(__fmul_rn(to_float(pack.v[e]) - mean, inv_std));
      const float factor = rounded<T>(__fadd_rn(1.0f, to_float(sc.v[e])));
      const float scaled = rounded<T>(__fmul_rn(normed, factor));
      result.v[e] = from_float<T>(__fadd_rn(scaled, to_float(sh.v[e])));
    }
    dst[i] = result;
  }
}

template <typename T, int V>
__global__ void add_gated_kernel(const T* x, const T* gate, int64_t gate_stride, const T* y, int64_t tokens,
                                 int64_t dim, int64_t total_packs, T* out) {
  using P = Pack<T, V>;
  const int64_t packs_per_row = dim / V;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total_packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / packs_per_row, column_pack = i % packs_per_row;
    const int64_t b = row / tokens;
    const P xs = reinterpret_cast<const P*>(x)[i], ys = reinterpret_cast<const P*>(y)[i];
    const P gs = reinterpret_cast<const P*>(gate + b * gate_stride)[column_pack];
    P result;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float gated = rounded<T>(__fmul_rn(to_float(gs.v[e]), to_float(ys.v[e])));
      result.v[e] = from_float<T>(__fadd_rn(to_float(xs.v[e]), gated));
    }
    reinterpret_cast<P*>(out)[i] = result;
  }
}

template <typename T, int V>
__global__ void gelu_tanh_kernel(RowView src, RowView dst, int64_t tokens, int64_t columns, int64_t total_packs) {
  using P = Pack<T, V>;
  const int64_t packs_per_row = columns / V;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total_packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / packs_per_row, column = (i % packs_per_row) * V;
    const int64_t b = row / tokens, token = row % tokens;
    const P in = *reinterpret_cast<const P*>(static_cast<const T*>(src.data) + b * src.batch_stride +
                                             token * src.row_stride + column);
    P result;
#pragma unroll
    for (int e = 0; e < V; ++e) result.v[e] = from_float<T>(gelu_tanh_value(to_float(in.v[e])));
    *reinterpret_cast<P*>(static_cast<T*>(dst.data) + b * dst.batch_stride + token * dst.row_stride + column) = result;
  }
}

int elementwise_blocks(int64_t packs, int threads) {
  const int64_t wanted = (packs + threads - 1) / threads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, 132 * 32)));
}

}  // namespace

void qk_norm_rope(ElementType type, const RowView& qkv, const void* norm_q, const void* norm_k, const float* cos,
                  const float* sin, float eps, const QkvLayout& layout, void* q, void* k, void* v,
                  cudaStream_t stream) {
  const int64_t warps = 3 * layout.batch * layout.tokens * layout.heads;
  if (warps == 0) return;
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kWide = 16 / sizeof(T);
    const int64_t lanes = layout.head_dim / kWide, rows = layout.batch * layout.tokens;
    const bool wide = layout.head_dim % kWide == 0 && lanes >= 1 && lanes <= 32 && (lanes & (lanes - 1)) == 0 &&
                      qkv.batch_stride % kWide == 0 && qkv.row_stride % kWide == 0 && aligned(qkv.data, 16) &&
                      aligned(norm_q, 16) && aligned(norm_k, 16) && aligned(cos, 16) && aligned(sin, 16) &&
                      aligned(q, 16) && aligned(k, 16) && aligned(v, 16) && rows <= INT32_MAX &&
                      3 * layout.heads * lanes <= INT32_MAX;
    if (wide) {
      constexpr int kThreads = 128;  // a multiple of every group size
      const dim3 grid(static_cast<unsigned>(rows),
                      static_cast<unsigned>((3 * layout.heads * lanes + kThreads - 1) / kThreads));
      qk_norm_rope_wide_kernel<T><<<grid, kThreads, 0, stream>>>(
          qkv, static_cast<const T*>(norm_q), static_cast<const T*>(norm_k), cos, sin, eps, layout,
          static_cast<int>(lanes), static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v));
      return;
    }
    constexpr int kThreads = 256;
    const int64_t blocks = (warps * 32 + kThreads - 1) / kThreads;
    qk_norm_rope_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        qkv, static_cast<const T*>(norm_q), static_cast<const T*>(norm_k), cos, sin, eps, layout, static_cast<T*>(q),
        static_cast<T*>(k), static_cast<T*>(v));
  });
}

void layer_norm_modulate(ElementType type, const void* x, const void* shift, const void* scale,
                         int64_t modulation_batch_stride, int64_t batch, int64_t tokens, int64_t dim, float eps,
                         void* out, cudaStream_t stream) {
  const int64_t rows = batch * tokens;
  if (rows == 0) return;
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kWide = 16 / sizeof(T);
    const bool vector = dim % kWide == 0 && modulation_batch_stride % kWide == 0 && aligned(x, 16) &&
                        aligned(shift, 16) && aligned(scale, 16) && aligned(out, 16);
    const int64_t packs = vector ? dim / kWide : dim;
    const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (packs + 31) / 32 * 32)));
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(shift), static_cast<const T*>(scale), modulation_batch_stride,
          tokens, dim, eps, static_cast<T*>(out));
    };
    if (vector) launch(layer_norm_modulate_kernel<T, kWide>);
    else launch(layer_norm_modulate_kernel<T, 1>);
  });
}

void add_gated(ElementType type, const void* x, const void* gate, int64_t gate_batch_stride, const void* y,
               int64_t batch, int64_t tokens, int64_t dim, void* out, cudaStream_t stream) {
  const int64_t elements = batch * tokens * dim;
  if (elements == 0) return;
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kWide = 16 / sizeof(T);
    const bool vector = dim % kWide == 0 && gate_batch_stride % kWide == 0 && aligned(x, 16) && aligned(gate, 16) &&
                        aligned(y, 16) && aligned(out, 16);
    constexpr int kThreads = 256;
    auto launch = [&](auto kernel, int width) {
      const int64_t packs = elements / width;
      kernel<<<elementwise_blocks(packs, kThreads), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(gate), gate_batch_stride, static_cast<const T*>(y), tokens,
          dim, packs, static_cast<T*>(out));
    };
    if (vector) launch(add_gated_kernel<T, kWide>, kWide);
    else launch(add_gated_kernel<T, 1>, 1);
  });
}

void gelu_tanh(ElementType type, const RowView& src, const RowView& dst, int64_t batch, int64_t tokens,
               int64_t columns, cudaStream_t stream) {
  const int64_t elements = batch * tokens * columns;
  if (elements == 0) return;
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kWide = 16 / sizeof(T);
    const bool vector = columns % kWide == 0 && src.row_stride % kWide == 0 && src.batch_stride % kWide == 0 &&
                        dst.row_stride % kWide == 0 && dst.batch_stride % kWide == 0 && aligned(src.data, 16) &&
                        aligned(dst.data, 16);
    constexpr int kThreads = 256;
    auto launch = [&](auto kernel, int width) {
      const int64_t packs = elements / width;
      kernel<<<elementwise_blocks(packs, kThreads), kThreads, 0, stream>>>(src, dst, tokens, columns, packs);
    };
    if (vector) launch(gelu_tanh_kernel<T, kWide>, kWide);
    else launch(gelu_tanh_kernel<T, 1>, 1);
  });
}

}  // namespace dp::models::flux::kernels
