// The modulation rows' projection: a few rows (one per image, or one per image and step) through a wide weight
// that is read once from memory. cuBLAS picks its kernel, and with it the order of the sums, by the number of
// rows; this kernel fixes the order by in_features alone (see modulation_rows.h for why).
#include "models/flux/cuda/modulation_rows.h"

#include <iterator>
#include <utility>

#include "models/cuda/element_math.cuh"

namespace dp::models::flux::kernels {
namespace {

using gpu::Pack;
using gpu::to_float;

constexpr int kWarpsPerBlock = 8;
// x's rows staged in shared memory by a block; the static limit, so no opt-in attribute is needed.
constexpr int kStagingBytes = 48 * 1024;

// The order of every sum, whichever kernel below computes it: the weight row is cut into chunks of
// V = 16 / sizeof(T) elements; lane l of a warp takes chunks l, l + 32, l + 64, ... in that order, adds their
// products with x into one fp32 sum per row and feature, element by element (fmaf), and the warp then adds the
// lanes' sums by a fixed butterfly. Nothing in it depends on the number of rows, on which rows a block takes, or on
// how many features a warp takes.

// kPacked: every row 16-byte aligned and in_features a multiple of V. Each warp takes kFeatures output features
// (independent 16-byte weight loads in flight: one row is bound by memory) and each block kRows rows of x
// (blockIdx.x), staged in shared memory a tile of chunks at a time (many rows are bound by arithmetic, and each x
// element read from shared memory serves kFeatures products). Blocks that share features are launched next to
// each other, so all but the first read the weights from L2.
template <typename T, int kFeatures, int kRows>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    packed_rows_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                       int64_t rows, int64_t out_features, int64_t in_features, int tile_chunks, T* __restrict__ out) {
  constexpr int V = 16 / sizeof(T);
  using Chunk = Pack<T, V>;
  extern __shared__ __align__(16) unsigned char staging_bytes[];
  auto* staged = reinterpret_cast<Chunk*>(staging_bytes);  // [kRows][tile_chunks]
  const int lane = threadIdx.x % 32;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRows;
  const int here = static_cast<int>(rows - first_row < kRows ? rows - first_row : kRows);
  const int64_t first_feature =
      (static_cast<int64_t>(blockIdx.y) * kWarpsPerBlock + threadIdx.x / 32) * kFeatures;
  const int64_t chunks = in_features / V;
  const auto* x_chunks = reinterpret_cast<const Chunk*>(x);
  const auto* weight_chunks = reinterpret_cast<const Chunk*>(weight);
  // A feature past the end repeats the last one's loads and is never stored: the warp stays whole for the shuffle.
  int64_t feature_rows[kFeatures];
#pragma unroll
  for (int f = 0; f < kFeatures; ++f)
    feature_rows[f] = (first_feature + f < out_features ? first_feature + f : out_features - 1) * chunks;
  float sums[kRows][kFeatures] = {};
  for (int64_t tile = 0; tile < chunks; tile += tile_chunks) {
    const int in_tile = static_cast<int>(chunks - tile < tile_chunks ? chunks - tile : tile_chunks);
    __syncthreads();  // the previous tile is read by every warp
    for (int i = threadIdx.x; i < here * in_tile; i += blockDim.x) {
      const int r = i / in_tile, c = i % in_tile;
      staged[r * tile_chunks + c] = x_chunks[(first_row + r) * chunks + tile + c];
    }
    __syncthreads();
#pragma unroll 2
    for (int c = lane; c < in_tile; c += 32) {
      Chunk w[kFeatures];
#pragma unroll
      for (int f = 0; f < kFeatures; ++f) w[f] = weight_chunks[feature_rows[f] + tile + c];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= here) continue;
        const Chunk a = staged[r * tile_chunks + c];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const float xi = to_float(a.v[i]);
#pragma unroll
          for (int f = 0; f < kFeatures; ++f) sums[r][f] = fmaf(xi, to_float(w[f].v[i]), sums[r][f]);
        }
      }
    }
  }
#pragma unroll
  for (int f = 0; f < kFeatures; ++f) {
    const int64_t feature = first_feature + f;
    const float bias_value = bias == nullptr || feature >= out_features ? 0.f : to_float(bias[feature]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= here) continue;
      const float total = gpu::warp_sum(sums[r][f]);
      if (lane == 0 && feature < out_features)
        out[(first_row + r) * out_features + feature] = gpu::from_float<T>(total + bias_value);
    }
  }
}

// Any alignment and width: one warp per feature, element by element in the same order as the packed kernel. A
// streamed copy of a weight may sit at another alignment than the resident one; its rows must not change.
template <typename T>
__global__ void unpacked_rows_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                     const T* __restrict__ bias, int64_t rows, int64_t out_features,
                                     int64_t in_features, T* __restrict__ out) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kRowsPerPass = 8;
  const int lane = threadIdx.x % 32;
  const int64_t feature = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (feature >= out_features) return;
  const int64_t chunks = (in_features + V - 1) / V;
  const T* weight_row = weight + feature * in_features;
  const float bias_value = bias == nullptr ? 0.f : to_float(bias[feature]);
  for (int64_t first = 0; first < rows; first += kRowsPerPass) {
    const int here = static_cast<int>(rows - first < kRowsPerPass ? rows - first : kRowsPerPass);
    float sums[kRowsPerPass] = {};
    for (int64_t c = lane; c < chunks; c += 32) {
      const int64_t k0 = c * V;
      const int valid = static_cast<int>(in_features - k0 < V ? in_features - k0 : V);
      for (int i = 0; i < valid; ++i) {
        const float w = to_float(weight_row[k0 + i]);
        for (int r = 0; r < here; ++r) sums[r] = fmaf(to_float(x[(first + r) * in_features + k0 + i]), w, sums[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerPass; ++r) {
      if (r >= here) break;
      const float total = gpu::warp_sum(sums[r]);
      if (lane == 0) out[(first + r) * out_features + feature] = gpu::from_float<T>(total + bias_value);
    }
  }
}

template <typename T, int kFeatures, int kRows>
void launch_packed(const void* x, const void* weight, const void* bias, int64_t rows, int64_t out_features,
                   int64_t in_features, void* out, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const int64_t chunks = in_features / V;
  // The widest tile that fits, a multiple of 32 chunks so that a lane's chunks stay in the same order.
  const int64_t fit = kStagingBytes / (kRows * 16) / 32 * 32;
  const int64_t whole = (chunks + 31) / 32 * 32;
  const int tile_chunks = static_cast<int>(whole < fit ? whole : fit);
  const int64_t features_per_block = int64_t{kWarpsPerBlock} * kFeatures;
  const dim3 grid(static_cast<unsigned>((rows + kRows - 1) / kRows),
                  static_cast<unsigned>((out_features + features_per_block - 1) / features_per_block));
  const size_t staging = static_cast<size_t>(kRows) * tile_chunks * 16;
  packed_rows_kernel<T, kFeatures, kRows><<<grid, kWarpsPerBlock * 32, staging, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), rows, out_features,
      in_features, tile_chunks, static_cast<T*>(out));
}

// The cuts there are kernels for (features a warp, rows a block): the one list that modulation_rows_shapes()
// reports and modulation_rows_shaped dispatches on.
constexpr ModulationRowsShape kCuts[] = {{4, 1}, {4, 2}, {4, 4}, {4, 8}, {2, 16}, {2, 32}};

// Launches the packed kernel of `shape` for T; false when no kernel has that cut.
template <typename T, size_t... kIndex>
bool launch_cut(ModulationRowsShape shape, std::index_sequence<kIndex...>, const void* x, const void* weight,
                const void* bias, int64_t rows, int64_t out_features, int64_t in_features, void* out,
                cudaStream_t stream) {
  return ((shape.features == kCuts[kIndex].features && shape.rows_per_block == kCuts[kIndex].rows_per_block &&
           (launch_packed<T, kCuts[kIndex].features, kCuts[kIndex].rows_per_block>(x, weight, bias, rows, out_features,
                                                                                  in_features, out, stream),
            true)) ||
          ...);
}

}  // namespace

std::vector<ModulationRowsShape> modulation_rows_shapes() { return {std::begin(kCuts), std::end(kCuts)}; }

ModulationRowsShape modulation_rows_shape(int64_t rows) {
  // Measured on an H100 with every shape (bench/RESULTS.md, session 23): a step's row or two are bound by reading
  // the weight, best cut one row a block (the blocks that share features finding the weights in L2); more rows
  // are bound by arithmetic and shared memory, best cut 4 rows a block.
  return rows <= 2 ? ModulationRowsShape{4, 1} : ModulationRowsShape{4, 4};
}

void modulation_rows(gpu::ElementType type, const void* x, const void* weight, const void* bias, int64_t rows,
                     int64_t out_features, int64_t in_features, void* out, cudaStream_t stream) {
  modulation_rows_shaped(modulation_rows_shape(rows), type, x, weight, bias, rows, out_features, in_features, out,
                         stream);
}

void modulation_rows_shaped(ModulationRowsShape shape, gpu::ElementType type, const void* x, const void* weight,
                            const void* bias, int64_t rows, int64_t out_features, int64_t in_features, void* out,
                            cudaStream_t stream) {
  if (rows == 0 || out_features == 0) return;
  gpu::with_type(type, [&](auto zero) {
    using T = decltype(zero);
    const bool packed = in_features % (16 / sizeof(T)) == 0 && gpu::aligned(x, 16) && gpu::aligned(weight, 16);
    if (!packed) {
      const auto blocks = static_cast<unsigned>((out_features + kWarpsPerBlock - 1) / kWarpsPerBlock);
      unpacked_rows_kernel<T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), rows, out_features,
          in_features, static_cast<T*>(out));
      return;
    }
    // An unknown cut takes the one modulation_rows would (the sums are the same bits either way).
    constexpr auto all = std::make_index_sequence<std::size(kCuts)>();
    if (!launch_cut<T>(shape, all, x, weight, bias, rows, out_features, in_features, out, stream))
      launch_cut<T>(modulation_rows_shape(rows), all, x, weight, bias, rows, out_features, in_features, out, stream);
  });
}

}  // namespace dp::models::flux::kernels
