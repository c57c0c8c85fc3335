#include "models/flux/flux_blocks.h"

#include "models/flux/flux_fused.h"
#include "models/flux/fp8_gemm.h"

namespace dp::models::flux {
namespace {

at::Tensor clip_if_half(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? x.clip(-65504, 65504) : x;
}

at::Tensor feed_forward(const Linear& in, const Linear& out, const at::Tensor& x) {
  if (takes_fp8_rows(out)) {
    // --fp8-gemms: the hidden layer reaches FP8 through its GELU in one pass, never stored after the GELU.
    const at::Tensor hidden = in(x);
    const Fp8Rows rows = quantize_rows_fp8(hidden.reshape({-1, hidden.size(-1)}), true, at::Tensor(), false);
    return fp8_product(rows, out, x.scalar_type()).view({x.size(0), x.size(1), -1});
  }
  return out(linear_gelu_tanh(x, in));
}

// [text, image] along the tokens. After a single block the two are adjacent slices of one tensor, so from
// the second single block on this is a view of it rather than a copy.
at::Tensor joined(const at::Tensor& text, const at::Tensor& image) {
  const int64_t width = text.size(2), tokens = text.size(1) + image.size(1);
  const bool adjacent = text.is_alias_of(image) && text.scalar_type() == image.scalar_type() &&
                        text.size(0) == image.size(0) && image.size(2) == width && text.stride(2) == 1 &&
                        image.stride(2) == 1 && text.stride(1) == width && image.stride(1) == width &&
                        text.stride(0) == tokens * width && image.stride(0) == tokens * width &&
                        image.storage_offset() == text.storage_offset() + text.size(1) * width;
  if (adjacent) return text.as_strided({text.size(0), tokens, width}, {tokens * width, width, 1});
  return at::cat({text, image}, 1);
}

Linear concat(const std::vector<Linear>& parts) { return Linear::concat(parts); }

at::Tensor map_tensor(const TensorMap& f, const at::Tensor& t) { return t.defined() ? f(t) : t; }

Linear map_linear(const TensorMap& f, const Linear& l) { return l.map(f); }

uint64_t tensor_bytes(const at::Tensor& t) { return t.defined() ? t.nbytes() : 0; }

}  // namespace

AttentionWeights AttentionWeights::map(const TensorMap& f) const {
  AttentionWeights a;
  a.qkv = map_linear(f, qkv);
  a.norm_q = map_tensor(f, norm_q);
  a.norm_k = map_tensor(f, norm_k);
  a.to_out = map_linear(f, to_out);
  a.added_qkv = map_linear(f, added_qkv);
  a.to_add_out = map_linear(f, to_add_out);
  a.norm_added_q = map_tensor(f, norm_added_q);
  a.norm_added_k = map_tensor(f, norm_added_k);
  return a;
}

DoubleBlock DoubleBlock::map(const TensorMap& f) const {
  DoubleBlock b;
  b.head_dim = head_dim;
  b.norm1 = map_linear(f, norm1);
  b.norm1_context = map_linear(f, norm1_context);
  b.attn = attn.map(f);
  b.ff_in = map_linear(f, ff_in);
  b.ff_out = map_linear(f, ff_out);
  b.ff_context_in = map_linear(f, ff_context_in);
  b.ff_context_out = map_linear(f, ff_context_out);
  return b;
}

uint64_t DoubleBlock::nbytes() const {
  uint64_t bytes = 0;
  map([&](const at::Tensor& t) {
    bytes += tensor_bytes(t);
    return t;
  });
  return bytes;
}

SingleBlock SingleBlock::map(const TensorMap& f) const {
  SingleBlock b;
  b.head_dim = head_dim;
  b.norm = map_linear(f, norm);
  b.proj_mlp = map_linear(f, proj_mlp);
  b.proj_out = map_linear(f, proj_out);
  b.attn = attn.map(f);
  return b;
}

uint64_t SingleBlock::nbytes() const {
  uint64_t bytes = 0;
  map([&](const at::Tensor& t) {
    bytes += tensor_bytes(t);
    return t;
  });
  return bytes;
}

AttentionWeights AttentionWeights::load(const ModuleWeights& w, const FluxConfig& c, bool joint) {
  const int64_t dim = c.inner_dim();
  AttentionWeights a;
  a.qkv = concat({Linear::load(w, "to_q", dim, dim), Linear::load(w, "to_k", dim, dim), Linear::load(w, "to_v", dim, dim)});
  a.norm_q = w.get_shaped("norm_q.weight", {c.attention_head_dim});
  a.norm_k = w.get_shaped("norm_k.weight", {c.attention_head_dim});
  if (joint) {
    a.to_out = Linear::load(w, "to_out.0", dim, dim);
    a.added_qkv = concat({Linear::load(w, "add_q_proj", dim, dim), Linear::load(w, "add_k_proj", dim, dim),
                          Linear::load(w, "add_v_proj", dim, dim)});
    a.to_add_out = Linear::load(w, "to_add_out", dim, dim);
    a.norm_added_q = w.get_shaped("norm_added_q.weight", {c.attention_head_dim});
    a.norm_added_k = w.get_shaped("norm_added_k.weight", {c.attention_head_dim});
  }
  return a;
}

DoubleBlock DoubleBlock::load(const ModuleWeights& w, const FluxConfig& c) {
  const int64_t dim = c.inner_dim();
  DoubleBlock b;
  b.head_dim = c.attention_head_dim;
  b.norm1 = Linear::load(w, "norm1.linear", dim, 6 * dim);
  b.norm1_context = Linear::load(w, "norm1_context.linear", dim, 6 * dim);
  b.attn = AttentionWeights::load(w.child("attn"), c, /*joint=*/true);
  b.ff_in = Linear::load(w, "ff.net.0.proj", dim, 4 * dim);
  b.ff_out = Linear::load(w, "ff.net.2", 4 * dim, dim);
  b.ff_context_in = Linear::load(w, "ff_context.net.0.proj", dim, 4 * dim);
  b.ff_context_out = Linear::load(w, "ff_context.net.2", 4 * dim, dim);
  return b;
}

BlockModulation BlockModulation::rows(int64_t first, int64_t count) const {
  return {image.narrow(0, first, count), text.defined() ? text.narrow(0, first, count) : text};
}

BlockModulation DoubleBlock::modulation(const at::Tensor& act, int64_t group_rows) const {
  return {modulation_rows(norm1, act, group_rows), modulation_rows(norm1_context, act, group_rows)};
}

void DoubleBlock::forward(at::Tensor& image, at::Tensor& text, const at::Tensor& temb, const RotaryTables& rope,
                          const SequenceShard* shard) const {
  forward(image, text, modulation(at::silu(temb)), rope, shard);
}

void DoubleBlock::forward(at::Tensor& image, at::Tensor& text, const BlockModulation& rows, const RotaryTables& rope,
                          const SequenceShard* shard) const {
  const auto mod = rows.image.chunk(6, 1);  // shift, scale, gate for attention, then for the MLP
  const auto cmod = rows.text.chunk(6, 1);
  const at::Tensor norm_image = layer_norm_modulate(image, mod[0], mod[1]);
  const at::Tensor norm_text = layer_norm_modulate(text, cmod[0], cmod[1]);

  // Joint attention runs over [text, image]: each stream's projection fills its own rows.
  const int64_t text_len = text.size(1);
  AttentionInputs joint_in = empty_attention_inputs(image.size(0), text_len + image.size(1),
                                                    norm_image.size(-1) / head_dim, head_dim, norm_image.options());
  fill_attention_inputs(attn.added_qkv(norm_text), attn.norm_added_q, attn.norm_added_k, rope, 0, joint_in);
  fill_attention_inputs(attn.qkv(norm_image), attn.norm_q, attn.norm_k, rope, text_len, joint_in);
  const at::Tensor joint = group_attention(joint_in.q, joint_in.k, joint_in.v, shard);
  const at::Tensor text_attn = attn.to_add_out(joint.slice(1, 0, text_len).contiguous());
  const at::Tensor image_attn = attn.to_out(joint.slice(1, text_len).contiguous());

  image = add_gated(image, mod[2], image_attn);
  image = add_gated(image, mod[5], feed_forward(ff_in, ff_out, layer_norm_modulate(image, mod[3], mod[4])));
  text = add_gated(text, cmod[2], text_attn);
  text = add_gated(text, cmod[5], feed_forward(ff_context_in, ff_context_out, layer_norm_modulate(text, cmod[3], cmod[4])));
  text = clip_if_half(text);
}

SingleBlock SingleBlock::load(const ModuleWeights& w, const FluxConfig& c) {
  const int64_t dim = c.inner_dim();
  SingleBlock b;
  b.head_dim = c.attention_head_dim;
  b.norm = Linear::load(w, "norm.linear", dim, 3 * dim);
  b.proj_mlp = Linear::load(w, "proj_mlp", dim, c.mlp_hidden_dim());
  b.proj_out = Linear::load(w, "proj_out", dim + c.mlp_hidden_dim(), dim);
  b.attn = AttentionWeights::load(w.child("attn"), c, /*joint=*/false);
  return b;
}

at::Tensor SingleBlock::attention_and_mlp(const at::Tensor& normed, const RotaryTables& rope,
                                          const SequenceShard* shard) const {
  const int64_t dim = normed.size(-1);
  const int64_t mlp_dim = proj_mlp.weight.size(0);
  AttentionInputs attention_in =
      empty_attention_inputs(normed.size(0), normed.size(1), dim / head_dim, head_dim, normed.options());
  if (takes_fp8_rows(attn.qkv) && takes_fp8_rows(proj_mlp) && takes_fp8_rows(proj_out)) {
    // --fp8-gemms: q|k|v and the MLP read one quantised copy of the normed rows, and proj_out reads
    // [attention | gelu(mlp)] quantised in one pass instead of a joined buffer.
    const auto tokens = [&](const at::Tensor& rows) { return rows.view({normed.size(0), normed.size(1), -1}); };
    const Fp8Rows normed_rows = quantize_rows_fp8(normed.reshape({-1, dim}));
    fill_attention_inputs(tokens(fp8_product(normed_rows, attn.qkv, normed.scalar_type())), attn.norm_q, attn.norm_k,
                          rope, 0, attention_in);
    const at::Tensor mlp = fp8_product(normed_rows, proj_mlp, normed.scalar_type());
    const at::Tensor attention = group_attention(attention_in.q, attention_in.k, attention_in.v, shard);
    const Fp8Rows mixed_rows = quantize_rows_fp8(attention.reshape({-1, dim}), false, mlp, true);
    return tokens(fp8_product(mixed_rows, proj_out, normed.scalar_type()));
  }
  fill_attention_inputs(attn.qkv(normed), attn.norm_q, attn.norm_k, rope, 0, attention_in);
  // proj_out reads [attention, gelu(mlp)]: both are written straight into one buffer instead of concatenated.
  const at::Tensor mixed = at::empty({normed.size(0), normed.size(1), dim + mlp_dim}, normed.options());
  linear_gelu_tanh_into(normed, proj_mlp, mixed.narrow(-1, dim, mlp_dim));
  mixed.narrow(-1, 0, dim).copy_(group_attention(attention_in.q, attention_in.k, attention_in.v, shard));
  return proj_out(mixed);
}

BlockModulation SingleBlock::modulation(const at::Tensor& act, int64_t group_rows) const {
  return {modulation_rows(norm, act, group_rows), {}};
}

void SingleBlock::forward(at::Tensor& image, at::Tensor& text, const at::Tensor& temb, const RotaryTables& rope,
                          const SequenceShard* shard) const {
  forward(image, text, modulation(at::silu(temb)), rope, shard);
}

void SingleBlock::forward(at::Tensor& image, at::Tensor& text, const BlockModulation& rows, const RotaryTables& rope,
                          const SequenceShard* shard) const {
  const int64_t text_len = text.size(1);
  const at::Tensor residual = joined(text, image);
  const auto mod = rows.image.chunk(3, 1);  // shift, scale, gate
  const at::Tensor normed = layer_norm_modulate(residual, mod[0], mod[1]);
  const at::Tensor joint = clip_if_half(add_gated(residual, mod[2], attention_and_mlp(normed, rope, shard)));
  text = joint.slice(1, 0, text_len);
  image = joint.slice(1, text_len);
}

}  // namespace dp::models::flux
