#pragma once
// The FLUX block steps that run as fused CUDA kernels on CUDA tensors (flux_fused_kernels.cu) and as the
// equivalent ATen composition everywhere else. Both paths round where diffusers rounds, so the CPU
// fallback is the reference the CUDA tests compare the kernels against.
#include <ATen/ATen.h>

#include <optional>

#include "models/flux/flux_layers.h"
#include "models/module_weights.h"

namespace dp::models::flux {

// On by default; DIFFPIPE_FUSED_KERNELS=0 in the environment, or this setter, selects the ATen path on
// CUDA too (A/B benchmarks, kernel tests).
bool fused_kernels_enabled();
void set_fused_kernels_enabled(bool enabled);

// Attention operands in (batch, tokens, heads, head_dim) contiguous layout, the layout SDPA's flash and
// cuDNN kernels read through a transposed view without a copy.
struct AttentionInputs {
  at::Tensor q, k, v;
};
AttentionInputs empty_attention_inputs(int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim,
                                       const at::TensorOptions& options);

// From a projection (B, T, >= 3 * heads * head_dim) holding q | k | v along its last dimension, fills
// token rows [token_offset, token_offset + T) of `out`: q and k RMS-normalised by their weights and
// rotated by rows [token_offset, token_offset + T) of `rope`, v copied.
void fill_attention_inputs(const at::Tensor& qkv, const at::Tensor& norm_q, const at::Tensor& norm_k,
                           const RotaryTables& rope, int64_t token_offset, AttentionInputs& out);

// LayerNorm(x) * (1 + scale[:, None]) + shift[:, None] for x (B, T, D), shift and scale (B, D).
at::Tensor layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

// x + gate[:, None] * y for x and y (B, T, D), gate (B, D).
at::Tensor add_gated(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

// dst = gelu(src, approximate="tanh"); src and dst (B, T, C) views with a contiguous last dimension, such
// as a column range of a larger projection or of a concatenation buffer.
void gelu_tanh_into(const at::Tensor& src, const at::Tensor& dst);

// out = gelu(layer(x), approximate="tanh") for x (B, T, K) and out (B, T, N) with contiguous rows (a column
// range of a wider buffer is fine). On CUDA the GELU runs in cuBLASLt's GEMM epilogue on the fp32
// accumulator, one rounding where diffusers rounds twice (after the linear and after the GELU); elsewhere,
// or when cuBLASLt has no algorithm, it is diffusers' linear then gelu.
void linear_gelu_tanh_into(const at::Tensor& x, const Linear& layer, const at::Tensor& out);
at::Tensor linear_gelu_tanh(const at::Tensor& x, const Linear& layer);

// Whether the blocks' modulation rows come from diffpipe's kernel on `device` and, on a first stage, from a table
// of the whole schedule (models::ModulationTable, pipeline::FluxStage::set_schedule): both or neither, since a
// table's rows equal a step's only when every rank computes them with the kernel (elsewhere the table runs the
// layer's own product a step at a time, the same bits too). DIFFPIPE_MODULATION_TABLE=1 turns them on, =0 off; off
// by default while the kernel is slower than cuBLAS (bench/RESULTS.md, session 22).
bool modulation_table_enabled(const at::Device& device);
// Tests and A/B benchmarks: true or false overrides DIFFPIPE_MODULATION_TABLE and the default; nullopt restores them.
void set_modulation_table_override(std::optional<bool> enabled);

// A block's AdaLayerNorm projection of silu(temb), (rows, dim) -> (rows, width): one row per image, 3.2 billion of
// FLUX.1-dev's weights read for a handful of rows every step. With modulation_table_enabled on CUDA, a kernel that
// reads the weight once for all rows and sums each row in an order fixed by dim alone (cuda/modulation_rows.h), so a
// row's result does not depend on how many rows come with it; otherwise, and with unfused LoRA adapters or FP8
// weights, the layer's own product, run on each group of `group_rows` rows (a step's) apart, each group copied out
// first, so that a table's rows are those of the same product a step at a time (0: all rows as one group).
at::Tensor modulation_rows(const Linear& layer, const at::Tensor& act, int64_t group_rows = 0);

}  // namespace dp::models::flux
