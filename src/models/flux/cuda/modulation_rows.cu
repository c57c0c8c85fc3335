// The modulation rows' projection: a few rows (one per image, or one per image and step) through a wide weight
// that is read once from memory. cuBLAS picks its kernel, and with it the order of the sums, by the number of
// rows; this kernel fixes the order by in_features alone (see modulation_rows.h for why).
#include "models/flux/cuda/modulation_rows.h"

#include "models/cuda/element_math.cuh"

namespace dp::models::flux::kernels {
namespace {

using gpu::Pack;
using gpu::to_float;

constexpr int kWarpsPerBlock = 8;
// Rows summed per pass over a weight row; a later pass re-reads the row from L1/L2, not from memory.
constexpr int kRowsPerPass = 8;

// One warp per output feature. The weight row is cut into chunks of V = 16 / sizeof(T) elements; lane l takes
// chunks l, l + 32, l + 64, ..., adds their products with x into one fp32 sum per row, element by element in that
// order, and the warp then adds the lanes' sums by a fixed butterfly. kPacked loads each chunk as one 16-byte
// transaction (every row 16-byte aligned, in_features a multiple of V); otherwise element by element, in the
// same order: the sums do not depend on alignment, which differs between a resident weight and a streamed copy.
template <typename T, bool kPacked>
__global__ void modulation_rows_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                       const T* __restrict__ bias, int64_t rows, int64_t out_features,
                                       int64_t in_features, T* __restrict__ out) {
  constexpr int V = 16 / sizeof(T);
  const int lane = threadIdx.x % 32;
  const int64_t feature = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (feature >= out_features) return;
  const int64_t chunks = (in_features + V - 1) / V;
  const T* weight_row = weight + feature * in_features;
  const float bias_value = bias == nullptr ? 0.f : to_float(bias[feature]);
  for (int64_t first = 0; first < rows; first += kRowsPerPass) {
    const int here = static_cast<int>(rows - first < kRowsPerPass ? rows - first : kRowsPerPass);
    float sums[kRowsPerPass] = {};
    // Unrolled so that each lane has several 16-byte weight loads in flight: the kernel is bound by memory.
#pragma unroll 4
    for (int64_t c = lane; c < chunks; c += 32) {
      const int64_t k0 = c * V;
      if (kPacked) {
        const Pack<T, V> w = reinterpret_cast<const Pack<T, V>*>(weight_row)[c];
#pragma unroll
        for (int r = 0; r < kRowsPerPass; ++r) {
          if (r >= here) continue;
          const Pack<T, V> a = reinterpret_cast<const Pack<T, V>*>(x + (first + r) * in_features)[c];
#pragma unroll
          for (int i = 0; i < V; ++i) sums[r] = fmaf(to_float(a.v[i]), to_float(w.v[i]), sums[r]);
        }
      } else {
        const int valid = static_cast<int>(in_features - k0 < V ? in_features - k0 : V);
        for (int i = 0; i < valid; ++i) {
          const float w = to_float(weight_row[k0 + i]);
          for (int r = 0; r < here; ++r) sums[r] = fmaf(to_float(x[(first + r) * in_features + k0 + i]), w, sums[r]);
        }
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

template <typename T, bool kPacked>
void launch(const void* x, const void* weight, const void* bias, int64_t rows, int64_t out_features,
            int64_t in_features, void* out, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((out_features + kWarpsPerBlock - 1) / kWarpsPerBlock);
  modulation_rows_kernel<T, kPacked><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), rows, out_features,
      in_features, static_cast<T*>(out));
}

}  // namespace

void modulation_rows(gpu::ElementType type, const void* x, const void* weight, const void* bias, int64_t rows,
                     int64_t out_features, int64_t in_features, void* out, cudaStream_t stream) {
  if (rows == 0 || out_features == 0) return;
  gpu::with_type(type, [&](auto zero) {
    using T = decltype(zero);
    const bool packed = in_features % (16 / sizeof(T)) == 0 && gpu::aligned(x, 16) && gpu::aligned(weight, 16);
    if (packed)
      launch<T, true>(x, weight, bias, rows, out_features, in_features, out, stream);
    else
      launch<T, false>(x, weight, bias, rows, out_features, in_features, out, stream);
  });
}

}  // namespace dp::models::flux::kernels
