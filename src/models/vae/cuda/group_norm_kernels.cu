// GroupNorm (and GroupNorm + SiLU) for the VAE's contiguous NCHW activations. ATen's kernel reduces each
// (sample, group) with a single block: a FLUX decode at 1024x1024 has 32 groups, so 32 blocks read up to 8.4M
// elements each while the rest of the GPU waits, and its norms took 51 ms of a 91 ms decode on an H100
// (bench/RESULTS.md, 2026-12-06, session 12). Here each group is split over many blocks whose partial statistics
// a small kernel combines, and the normalisation is one vectorised pass, with the SiLU that follows every norm
// but the attention's folded in.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "models/cuda/element_math.cuh"
#include "models/vae/cuda/group_norm_kernels.h"

namespace dp::models::vae::kernels {
namespace {

using gpu::aligned;
using gpu::from_float;
using gpu::Pack;
using gpu::rounded;
using gpu::to_float;
using gpu::with_type;

constexpr int kThreads = 256;
constexpr int kPacksPerThread = 4;  // a statistics block reads kThreads * kPacksPerThread packs of its group
constexpr int64_t kMaxSplits = 1024;

// Count, mean and sum of squared deviations of some elements; two combine exactly as Chan et al. give.
template <typename F>
struct Moments {
  F count, mean, m2;
};

template <typename F>
__device__ __forceinline__ Moments<F> combine(const Moments<F>& a, const Moments<F>& b) {
  const F count = a.count + b.count;
  if (count == F(0)) return {F(0), F(0), F(0)};
  const F delta = b.mean - a.mean, share = b.count / count;
  return {count, a.mean + delta * share, a.m2 + b.m2 + delta * delta * a.count * share};
}

// The block's combined moments, valid in thread 0.
template <typename F>
__device__ Moments<F> block_combine(Moments<F> m) {
  __shared__ Moments<F> per_warp[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) {
    const Moments<F> other{__shfl_down_sync(0xffffffffu, m.count, offset), __shfl_down_sync(0xffffffffu, m.mean, offset),
                           __shfl_down_sync(0xffffffffu, m.m2, offset)};
    m = combine(m, other);
  }
  if (lane == 0) per_warp[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) m = combine(m, per_warp[w]);
  }
  return m;
}

// Block (group g, split s) reads elements [s * chunk, (s + 1) * chunk) of group g (its channels' planes are
// consecutive in NCHW) and writes their moments to partials[g * splits + s]. Each thread sums its elements'
// differences from the first one it reads (exact enough for the few dozen it sees), then the block combines.
template <typename T, int V>
__global__ void group_moments_kernel(const T* x, int64_t group_elements, int64_t chunk, Moments<float>* partials) {
  const int64_t group = blockIdx.x, split = blockIdx.y;
  const int64_t begin = split * chunk;
  const int64_t end = begin + chunk < group_elements ? begin + chunk : group_elements;
  const T* base = x + group * group_elements;
  float shift = 0.0f, sum = 0.0f, squares = 0.0f, count = 0.0f;
  for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * V; i < end; i += static_cast<int64_t>(blockDim.x) * V) {
    const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(base + i);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float value = to_float(pack.v[e]);
      if (count == 0.0f) shift = value;
      const float d = value - shift;
      sum += d;
      squares += d * d;
      count += 1.0f;
    }
  }
  Moments<float> mine{0.0f, 0.0f, 0.0f};
  if (count > 0.0f) mine = {count, shift + sum / count, fmaxf(squares - sum * sum / count, 0.0f)};
  const Moments<float> block = block_combine(mine);
  if (threadIdx.x == 0) partials[group * gridDim.y + split] = block;
}

// One block per group: its splits' moments combined in double, then mean and rstd = rsqrt(var + eps) in fp32 as
// ATen's kernel has them.
__global__ void group_statistics_kernel(const Moments<float>* partials, int64_t splits, float eps, float* stats) {
  const int64_t group = blockIdx.x;
  Moments<double> m{0.0, 0.0, 0.0};
  for (int64_t s = threadIdx.x; s < splits; s += blockDim.x) {
    const Moments<float> p = partials[group * splits + s];
    m = combine(m, Moments<double>{p.count, p.mean, p.m2});
  }
  m = block_combine(m);
  if (threadIdx.x == 0) {
    const float variance = m.count > 0.0 ? static_cast<float>(m.m2 / m.count) : 0.0f;
    stats[2 * group] = static_cast<float>(m.mean);
    stats[2 * group + 1] = rsqrtf(fmaxf(variance, 0.0f) + eps);
  }
}

// out = x * a + b per channel (a pack never spans two channels: spatial % V == 0), then SiLU when asked.
template <typename T, int V, bool kSilu>
__global__ void group_norm_apply_kernel(const T* x, const T* gamma, const T* beta, const float* stats,
                                        int64_t channels, int64_t spatial, int64_t groups, int64_t total_packs, T* out) {
  const int64_t channels_per_group = channels / groups;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total_packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t plane = i * V / spatial;  // sample * channels + channel
    const int64_t channel = plane % channels;
    const int64_t group = (plane / channels) * groups + channel / channels_per_group;
    // ATen keeps mean and rstd in the input's dtype (native_group_norm's outputs), so a 16-bit run rounds them.
    const float mean = rounded<T>(stats[2 * group]), rstd = rounded<T>(stats[2 * group + 1]);
    const float a = rstd * to_float(gamma[channel]);
    const float b = fmaf(-a, mean, to_float(beta[channel]));
    const Pack<T, V> pack = reinterpret_cast<const Pack<T, V>*>(x)[i];
    Pack<T, V> result;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float y = fmaf(to_float(pack.v[e]), a, b);
      if (kSilu) {
        const float normed = rounded<T>(y);
        y = normed / (1.0f + expf(-normed));
      }
      result.v[e] = from_float<T>(y);
    }
    reinterpret_cast<Pack<T, V>*>(out)[i] = result;
  }
}

// 16-byte packs when every channel's plane is a whole number of them and both ends are aligned.
template <typename T>
bool packs_fit(const GroupNormShape& shape, const void* x, const void* out) {
  return shape.spatial % static_cast<int64_t>(16 / sizeof(T)) == 0 && aligned(x, 16) && aligned(out, 16);
}

// The split of a group of `elements` into chunks a whole number of packs long.
int64_t chunk_of(int64_t elements, int width) {
  const int64_t per_block = static_cast<int64_t>(kThreads) * kPacksPerThread * width;
  const int64_t splits = std::min(kMaxSplits, std::max<int64_t>(1, (elements + per_block - 1) / per_block));
  const int64_t chunk = (elements + splits - 1) / splits;
  return (chunk + width - 1) / width * width;
}

int64_t splits_of(int64_t elements, int64_t chunk) { return std::max<int64_t>(1, (elements + chunk - 1) / chunk); }

}  // namespace

int64_t group_norm_workspace_floats(ElementType type, const GroupNormShape& shape) {
  const int64_t groups = shape.batch * shape.groups;
  const int64_t elements = shape.channels / std::max<int64_t>(shape.groups, 1) * shape.spatial;
  (void)type;  // one-element packs split a group the most ways: room for any width
  return groups * splits_of(elements, chunk_of(elements, 1)) * 3 + groups * 2;
}

void group_norm(ElementType type, const void* x, const void* gamma, const void* beta, const GroupNormShape& shape,
                float eps, bool silu, float* workspace, void* out, cudaStream_t stream) {
  const int64_t groups = shape.batch * shape.groups;
  const int64_t elements = shape.channels / shape.groups * shape.spatial;
  if (groups == 0 || elements == 0) return;
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto width_tag) {
      constexpr int V = decltype(width_tag)::value;
      const int64_t chunk = chunk_of(elements, V), splits = splits_of(elements, chunk);
      auto* partials = reinterpret_cast<Moments<float>*>(workspace);
      float* stats = workspace + groups * splits * 3;
      group_moments_kernel<T, V><<<dim3(static_cast<unsigned>(groups), static_cast<unsigned>(splits)), kThreads, 0,
                                   stream>>>(static_cast<const T*>(x), elements, chunk, partials);
      group_statistics_kernel<<<static_cast<unsigned>(groups), kThreads, 0, stream>>>(partials, splits, eps, stats);
      const int64_t packs = groups * elements / V;
      const auto blocks = static_cast<unsigned>(std::min<int64_t>((packs + kThreads - 1) / kThreads, 132 * 32));
      const auto launch = [&](auto kernel) {
        kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(gamma),
                                                static_cast<const T*>(beta), stats, shape.channels, shape.spatial,
                                                shape.groups, packs, static_cast<T*>(out));
      };
      if (silu) launch(group_norm_apply_kernel<T, V, true>);
      else launch(group_norm_apply_kernel<T, V, false>);
    };
    if (packs_fit<T>(shape, x, out)) run(std::integral_constant<int, 16 / sizeof(T)>{});
    else run(std::integral_constant<int, 1>{});
  });
}

}  // namespace dp::models::vae::kernels
