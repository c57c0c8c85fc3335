#pragma once
// Raw-pointer launchers of the fused FLUX CUDA kernels (flux_fused_kernels.cu). No ATen here, so nvcc
// never parses LibTorch headers; flux_fused.cpp checks shapes and strides before calling these.
// Every kernel rounds to the storage type exactly where diffusers' eager ops round.
#include <cstdint>

#include <cuda_runtime_api.h>

#include "models/cuda/element_type.h"

namespace dp::models::flux::kernels {

using ElementType = gpu::ElementType;

// Strided rows of a (batch, rows, columns) view whose last dimension is contiguous.
struct RowView {
  void* data = nullptr;
  int64_t batch_stride = 0;  // elements
  int64_t row_stride = 0;    // elements
};

struct QkvLayout {
  int64_t batch = 0, tokens = 0, heads = 0, head_dim = 0;
  int64_t total_tokens = 0;  // sequence length of the outputs (text + image for joint attention)
  int64_t token_offset = 0;  // first output row (and rotary row) these tokens fill
};

// q and k: RMSNorm over head_dim (fp32 statistics, eps), scale by the norm weight, rotary embedding
// with interleaved pairs; v: copied. `qkv` holds q | k | v along its columns (more columns may follow).
// Outputs are contiguous (batch, total_tokens, heads, head_dim); cos/sin are fp32 (total_tokens, head_dim).
void qk_norm_rope(ElementType type, const RowView& qkv, const void* norm_q, const void* norm_k, const float* cos,
                  const float* sin, float eps, const QkvLayout& layout, void* q, void* k, void* v, cudaStream_t stream);

// out = LayerNorm(x) * (1 + scale[b]) + shift[b]; x and out contiguous (batch, tokens, dim); shift and scale
// rows of `dim` elements, one per batch entry, `modulation_batch_stride` elements apart.
void layer_norm_modulate(ElementType type, const void* x, const void* shift, const void* scale,
                         int64_t modulation_batch_stride, int64_t batch, int64_t tokens, int64_t dim, float eps,
                         void* out, cudaStream_t stream);

// out = x + gate[b] * y, all (batch, tokens, dim) contiguous except gate (rows `gate_batch_stride` apart).
void add_gated(ElementType type, const void* x, const void* gate, int64_t gate_batch_stride, const void* y,
               int64_t batch, int64_t tokens, int64_t dim, void* out, cudaStream_t stream);

// dst = gelu_tanh(src) over (batch, tokens, columns) strided row views.
void gelu_tanh(ElementType type, const RowView& src, const RowView& dst, int64_t batch, int64_t tokens,
               int64_t columns, cudaStream_t stream);

}  // namespace dp::models::flux::kernels
