#pragma once
// The two FLUX block kinds, holding their weights under the checkpoint's key names.
#include <ATen/ATen.h>

#include <functional>

#include "models/flux/flux_config.h"
#include "models/flux/flux_layers.h"
#include "models/flux/sequence_parallel.h"
#include "models/module_weights.h"

namespace dp::models::flux {

// Applied to every weight of a block to copy it elsewhere (pinned host memory, a GPU); undefined tensors stay
// undefined. Offloaded blocks use it to move between host and device without reloading.
using TensorMap = std::function<at::Tensor(const at::Tensor&)>;

struct AttentionWeights {
  // to_q, to_k and to_v read the same input, so they run as one GEMM over concatenated weights.
  Linear qkv;
  at::Tensor norm_q, norm_k;
  // Double blocks only: output projection and the text-stream projections.
  Linear to_out, added_qkv, to_add_out;
  at::Tensor norm_added_q, norm_added_k;
  static AttentionWeights load(const ModuleWeights& w, const FluxConfig& c, bool joint);
  AttentionWeights map(const TensorMap& f) const;
};

// A block's AdaLayerNorm rows for one step, (B, width) each: a double block's image (norm1) and text
// (norm1_context) rows, a single block's (norm) in `image`. Computed from silu(temb) a step at a time, or sliced out
// of rows computed for a whole schedule at once (FluxTransformer::modulation_table); both give the same bits.
struct BlockModulation {
  at::Tensor image, text;
  // Rows [first, first + count) of each.
  BlockModulation rows(int64_t first, int64_t count) const;
};

// FluxTransformerBlock: separate image and text streams meeting in joint attention.
struct DoubleBlock {
  Linear norm1, norm1_context;  // AdaLayerNormZero projections (dim -> 6 dim)
  AttentionWeights attn;
  Linear ff_in, ff_out, ff_context_in, ff_context_out;
  int64_t head_dim = 0;
  static DoubleBlock load(const ModuleWeights& w, const FluxConfig& c);
  DoubleBlock map(const TensorMap& f) const;
  uint64_t nbytes() const;
  // `act` is silu(temb), (rows, D); `group_rows` as modulation_rows (flux_fused.h) takes it.
  BlockModulation modulation(const at::Tensor& act, int64_t group_rows = 0) const;
  // Updates image (B, N, D) and text (B, T, D) in place of the caller's handles. With a `shard` of several
  // members they are this member's tokens and `rope` its rows (shard_rotary); attention spans the whole sequence.
  void forward(at::Tensor& image, at::Tensor& text, const at::Tensor& temb, const RotaryTables& rope,
               const SequenceShard* shard = nullptr) const;
  void forward(at::Tensor& image, at::Tensor& text, const BlockModulation& mod, const RotaryTables& rope,
               const SequenceShard* shard = nullptr) const;
};

// FluxSingleTransformerBlock: one stream over [text, image], attention and MLP in parallel.
struct SingleBlock {
  Linear norm;  // AdaLayerNormZeroSingle projection (dim -> 3 dim)
  // proj_mlp is its own GEMM (not fused with q, k, v) so that its GELU can run in the GEMM's epilogue.
  Linear proj_mlp, proj_out;
  AttentionWeights attn;
  int64_t head_dim = 0;
  static SingleBlock load(const ModuleWeights& w, const FluxConfig& c);
  SingleBlock map(const TensorMap& f) const;
  uint64_t nbytes() const;
  BlockModulation modulation(const at::Tensor& act, int64_t group_rows = 0) const;  // act = silu(temb)
  void forward(at::Tensor& image, at::Tensor& text, const at::Tensor& temb, const RotaryTables& rope,
               const SequenceShard* shard = nullptr) const;
  void forward(at::Tensor& image, at::Tensor& text, const BlockModulation& mod, const RotaryTables& rope,
               const SequenceShard* shard = nullptr) const;

 private:
  // proj_out([attention(normed) | gelu(proj_mlp(normed))]), in bf16 or through FP8 GEMMs (--fp8-gemms).
  at::Tensor attention_and_mlp(const at::Tensor& normed, const RotaryTables& rope, const SequenceShard* shard) const;
};

}  // namespace dp::models::flux
