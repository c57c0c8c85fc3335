#include "models/flux_blocks.h"

namespace dp::models::flux {
namespace {

at::Tensor heads(const at::Tensor& x, int64_t head_dim) { return x.unflatten(-1, {-1, head_dim}); }

at::Tensor clip_if_half(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? x.clip(-65504, 65504) : x;
}

at::Tensor feed_forward(const Linear& in, const Linear& out, const at::Tensor& x) {
  return out(at::gelu(in(x), "tanh"));
}

Linear concat(const std::vector<Linear>& parts) {
  std::vector<at::Tensor> weights, biases;
  for (const auto& p : parts) {
    weights.push_back(p.weight);
    biases.push_back(p.bias);
  }
  return {at::cat(weights, 0), at::cat(biases, 0)};
}

}  // namespace

AttentionWeights AttentionWeights::load(const ModuleWeights& w, const FluxConfig& c, bool joint, const Linear* extra) {
  const int64_t dim = c.inner_dim();
  AttentionWeights a;
  std::vector<Linear> projections = {Linear::load(w, "to_q", dim, dim), Linear::load(w, "to_k", dim, dim),
                                     Linear::load(w, "to_v", dim, dim)};
  if (extra != nullptr) projections.push_back(*extra);
  a.qkv = concat(projections);
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

void DoubleBlock::forward(at::Tensor& image, at::Tensor& text, const at::Tensor& temb,
                          const RotaryTables& rope) const {
  const at::Tensor act = at::silu(temb);
  const auto mod = norm1(act).chunk(6, 1);  // shift, scale, gate for attention, then for the MLP
  const auto cmod = norm1_context(act).chunk(6, 1);
  const at::Tensor norm_image = modulate(layer_norm(image), mod[0], mod[1]);
  const at::Tensor norm_text = modulate(layer_norm(text), cmod[0], cmod[1]);

  const auto image_qkv = attn.qkv(norm_image).chunk(3, -1);
  const auto text_qkv = attn.added_qkv(norm_text).chunk(3, -1);
  at::Tensor q = rms_norm(heads(image_qkv[0], head_dim), attn.norm_q);
  at::Tensor k = rms_norm(heads(image_qkv[1], head_dim), attn.norm_k);
  at::Tensor v = heads(image_qkv[2], head_dim);
  const at::Tensor cq = rms_norm(heads(text_qkv[0], head_dim), attn.norm_added_q);
  const at::Tensor ck = rms_norm(heads(text_qkv[1], head_dim), attn.norm_added_k);
  const at::Tensor cv = heads(text_qkv[2], head_dim);
  q = apply_rotary(at::cat({cq, q}, 1), rope);
  k = apply_rotary(at::cat({ck, k}, 1), rope);
  v = at::cat({cv, v}, 1);
  const at::Tensor joint = attention(q, k, v);
  const int64_t text_len = text.size(1);
  const at::Tensor text_attn = attn.to_add_out(joint.slice(1, 0, text_len).contiguous());
  const at::Tensor image_attn = attn.to_out(joint.slice(1, text_len).contiguous());

  image = image + mod[2].unsqueeze(1) * image_attn;
  image = image + mod[5].unsqueeze(1) * feed_forward(ff_in, ff_out, modulate(layer_norm(image), mod[3], mod[4]));
  text = text + cmod[2].unsqueeze(1) * text_attn;
  text = text + cmod[5].unsqueeze(1) *
                    feed_forward(ff_context_in, ff_context_out, modulate(layer_norm(text), cmod[3], cmod[4]));
  text = clip_if_half(text);
}

SingleBlock SingleBlock::load(const ModuleWeights& w, const FluxConfig& c) {
  const int64_t dim = c.inner_dim();
  SingleBlock b;
  b.head_dim = c.attention_head_dim;
  b.norm = Linear::load(w, "norm.linear", dim, 3 * dim);
  const Linear proj_mlp = Linear::load(w, "proj_mlp", dim, c.mlp_hidden_dim());
  b.proj_out = Linear::load(w, "proj_out", dim + c.mlp_hidden_dim(), dim);
  b.attn = AttentionWeights::load(w.child("attn"), c, /*joint=*/false, &proj_mlp);
  return b;
}

void SingleBlock::forward(at::Tensor& image, at::Tensor& text, const at::Tensor& temb,
                          const RotaryTables& rope) const {
  const int64_t text_len = text.size(1);
  const at::Tensor residual = at::cat({text, image}, 1);
  const auto mod = norm(at::silu(temb)).chunk(3, 1);  // shift, scale, gate
  const at::Tensor normed = modulate(layer_norm(residual), mod[0], mod[1]);
  const int64_t dim = normed.size(-1);
  const auto projected = attn.qkv(normed).split_with_sizes({dim, dim, dim, attn.qkv.weight.size(0) - 3 * dim}, -1);
  const at::Tensor mlp = at::gelu(projected[3], "tanh");
  const at::Tensor q = apply_rotary(rms_norm(heads(projected[0], head_dim), attn.norm_q), rope);
  const at::Tensor k = apply_rotary(rms_norm(heads(projected[1], head_dim), attn.norm_k), rope);
  const at::Tensor v = heads(projected[2], head_dim);
  const at::Tensor attn_out = attention(q, k, v);
  const at::Tensor joint = clip_if_half(residual + mod[2].unsqueeze(1) * proj_out(at::cat({attn_out, mlp}, 2)));
  text = joint.slice(1, 0, text_len);
  image = joint.slice(1, text_len);
}

}  // namespace dp::models::flux
