#include "models/t5/t5_encoder.h"

#include <c10/core/InferenceMode.h>

#include <cmath>
#include <chrono>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/json_file.h"
#include "models/attention.h"
#include "models/warm_up_allowance.h"
#include "io/weight_index.h"

namespace dp::models {

at::Tensor T5Encoder::LayerNorm::operator()(const at::Tensor& x) const {
  // Root mean square only (no mean, no bias), accumulated in fp32 whatever the input dtype; the product
  // stays fp32 and is rounded to the weight's dtype only for half-precision weights.
  const at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor y = x * at::rsqrt(variance + eps);
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) y = y.to(weight.scalar_type());
  return weight * y;
}

T5Encoder T5Encoder::load(const std::string& dir, at::ScalarType dtype, at::Device device) {
  DP_CHECK(std::filesystem::is_directory(dir), dir, ": T5 encoder folder not found");
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  T5Encoder model;
  model.config_ = T5Config::from_json(read_json_file(config_path), config_path);
  model.dtype_ = dtype;
  model.device_ = device;
  const T5Config& c = model.config_;
  model.activation_ = text_encoder_activation(c.dense_act_fn, config_path);

  auto index = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(dir));
  const bool shared = index->contains("shared.weight");
  const std::string embed_key = shared ? "shared.weight" : "encoder.embed_tokens.weight";
  const std::string unused_embed_key = shared ? "encoder.embed_tokens.weight" : "shared.weight";
  const ModuleWeights root =
      ModuleWeights(index, dtype, device).read_ahead([&](const std::string& name) { return name != unused_embed_key; });
  model.embed_tokens_ = root.get_shaped(embed_key, {c.vocab_size, c.d_model});

  // transformers keeps "wo" in fp32 when asked for fp16 (not for bf16): fp16 overflows there in T5 v1.1.
  const at::ScalarType wo_dtype = dtype == at::kHalf ? at::kFloat : dtype;
  const ModuleWeights wo_root = root.with_dtype(wo_dtype);
  const int64_t d = c.d_model, inner = c.inner_dim();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string prefix = "encoder.block." + std::to_string(i) + ".layer";
    const ModuleWeights attention = root.child(prefix + ".0");
    const ModuleWeights ff = root.child(prefix + ".1");
    Block block;
    block.attention_norm = {attention.get_shaped("layer_norm.weight", {d}), c.layer_norm_epsilon};
    block.q = Linear::load(attention, "SelfAttention.q", d, inner, false);
    block.k = Linear::load(attention, "SelfAttention.k", d, inner, false);
    block.v = Linear::load(attention, "SelfAttention.v", d, inner, false);
    block.o = Linear::load(attention, "SelfAttention.o", inner, d, false);
    block.ff_norm = {ff.get_shaped("layer_norm.weight", {d}), c.layer_norm_epsilon};
    if (c.is_gated_act) {
      block.wi_0 = Linear::load(ff, "DenseReluDense.wi_0", d, c.d_ff, false);
      block.wi_1 = Linear::load(ff, "DenseReluDense.wi_1", d, c.d_ff, false);
    } else {
      block.wi = Linear::load(ff, "DenseReluDense.wi", d, c.d_ff, false);
    }
    block.wo = Linear::load(wo_root.child(prefix + ".1"), "DenseReluDense.wo", c.d_ff, d, false);
    model.blocks_.push_back(std::move(block));
  }
  model.relative_attention_bias_ = root.get_shaped("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                                                   {c.relative_attention_num_buckets, c.num_heads});
  model.final_layer_norm_ = {root.get_shaped("encoder.final_layer_norm.weight", {d}), c.layer_norm_epsilon};
  return model;
}

at::Tensor T5Encoder::relative_position_buckets(int64_t seq_len, at::Device device) const {
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor position = at::arange(seq_len, long_options);
  const at::Tensor relative = position.unsqueeze(0) - position.unsqueeze(1);  // key - query
  // The same op sequence as transformers (fp32 log, truncation to int64), so bucket borders agree exactly.
  const int64_t per_direction = config_.relative_attention_num_buckets / 2;
  const int64_t max_exact = per_direction / 2;
  const at::Tensor direction_offset = relative.gt(0).to(at::kLong) * per_direction;
  const at::Tensor distance = relative.abs();
  const double log_range = std::log(double(config_.relative_attention_max_distance) / double(max_exact));
  at::Tensor log_bucket =
      (at::log(distance.to(at::kFloat) / max_exact) / log_range * (per_direction - max_exact)).to(at::kLong) +
      max_exact;
  log_bucket = at::minimum(log_bucket, at::full_like(log_bucket, per_direction - 1));
  return direction_offset + at::where(distance.lt(max_exact), distance, log_bucket);
}

namespace {

// T5Block's guard for fp16: clamp to just below the fp16 range, further when an inf already appeared.
// Kept on the device (no .item()) as the reference does.
at::Tensor clamp_fp16(const at::Tensor& x) {
  if (x.scalar_type() != at::kHalf) return x;
  const double max = 65504.0;  // torch.finfo(torch.float16).max
  const auto options = at::TensorOptions().dtype(at::kFloat).device(x.device());
  const at::Tensor limit =
      at::where(at::isinf(x).any(), at::scalar_tensor(max - 1000.0, options), at::scalar_tensor(max, options));
  return at::clamp(x, -limit, limit);
}

}  // namespace

at::Tensor T5Encoder::feed_forward(const Block& block, const at::Tensor& normed) const {
  at::Tensor hidden = config_.is_gated_act ? activation_(block.wi_0(normed)) * block.wi_1(normed)
                                           : activation_(block.wi(normed));
  // With an fp32 "wo" (fp16 runs) the input is promoted first, so the residual stream becomes fp32.
  if (hidden.scalar_type() != block.wo.weight.scalar_type()) hidden = hidden.to(block.wo.weight.scalar_type());
  return block.wo(hidden);
}

at::Tensor T5Encoder::block_forward(const Block& block, const at::Tensor& hidden, const at::Tensor& position_bias) const {
  const int64_t batch = hidden.size(0), seq = hidden.size(1);
  const int64_t heads = config_.num_heads, head_dim = config_.d_kv;
  const at::Tensor normed = block.attention_norm(hidden);
  auto split_heads = [&](const at::Tensor& x) { return x.view({batch, seq, heads, head_dim}).transpose(1, 2); };
  const at::Tensor q = split_heads(block.q(normed));
  const at::Tensor k = split_heads(block.k(normed));
  const at::Tensor v = split_heads(block.v(normed));
  // transformers' SDPA path: the position bias is the additive mask and the scores are not scaled.
  const at::Tensor attended = encoder_attention(q, k, v, position_bias, false, 1.0)
                                  .transpose(1, 2)
                                  .contiguous()
                                  .reshape({batch, seq, heads * head_dim});
  const at::Tensor after_attention = clamp_fp16(hidden + block.o(attended));
  return clamp_fp16(after_attention + feed_forward(block, block.ff_norm(after_attention)));
}

double T5Encoder::warm_up(const T5Config& c, at::ScalarType dtype, at::Device device, int64_t batch, int64_t seq) {
  c10::InferenceMode inference;
  const auto started = std::chrono::steady_clock::now();
  T5Encoder model;
  model.config_ = c;
  model.dtype_ = dtype;
  model.device_ = device;
  model.activation_ = text_encoder_activation(c.dense_act_fn, "T5 warm-up");
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  const auto zeros = [&](std::vector<int64_t> shape, at::ScalarType type) {
    return at::zeros(shape, options.dtype(type));
  };
  const int64_t d = c.d_model, inner = c.inner_dim();
  // Token 0 only: the embedding lookup runs, without a vocabulary-sized table.
  model.embed_tokens_ = zeros({1, d}, dtype);
  model.relative_attention_bias_ = zeros({c.relative_attention_num_buckets, c.num_heads}, dtype);
  Block block;
  block.attention_norm = {zeros({d}, dtype), c.layer_norm_epsilon};
  block.ff_norm = {zeros({d}, dtype), c.layer_norm_epsilon};
  block.q = {zeros({inner, d}, dtype), {}, nullptr, {}};
  block.k = {zeros({inner, d}, dtype), {}, nullptr, {}};
  block.v = {zeros({inner, d}, dtype), {}, nullptr, {}};
  block.o = {zeros({d, inner}, dtype), {}, nullptr, {}};
  if (c.is_gated_act) {
    block.wi_0 = {zeros({c.d_ff, d}, dtype), {}, nullptr, {}};
    block.wi_1 = {zeros({c.d_ff, d}, dtype), {}, nullptr, {}};
  } else {
    block.wi = {zeros({c.d_ff, d}, dtype), {}, nullptr, {}};
  }
  block.wo = {zeros({d, c.d_ff}, dtype == at::kHalf ? at::kFloat : dtype), {}, nullptr, {}};
  model.blocks_.push_back(std::move(block));
  model.final_layer_norm_ = {zeros({d}, dtype), c.layer_norm_epsilon};
  const at::Tensor ids = at::zeros({batch, seq}, at::TensorOptions().dtype(at::kLong));
  (void)model.forward(ids).sum().item<float>();  // waits for the device
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

int64_t T5Encoder::warm_up_bytes(const T5Config& c, at::ScalarType dtype, int64_t batch, int64_t seq) {
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t d = c.d_model, inner = c.inner_dim(), feed_forward = c.is_gated_act ? 2 * c.d_ff : c.d_ff;
  // wo is fp32 under fp16 (as load keeps it): counted at 4 bytes whatever the dtype.
  const int64_t weights = (4 * inner * d + feed_forward * d + 3 * d + c.relative_attention_num_buckets * c.num_heads) *
                              element + d * c.d_ff * 4;
  // The hidden states, q, k, v and the attention output, the feed-forward's inner rows, and the scores with
  // their softmax.
  const int64_t activations = batch * seq * (8 * d + 4 * inner + 3 * c.d_ff) * 4 + batch * c.num_heads * seq * seq * 8;
  return weights + activations + kWarmUpLibraryWorkspaceBytes + kWarmUpSmallTensorsBytes;
}

at::Tensor T5Encoder::forward(const at::Tensor& input_ids) const {
  c10::InferenceMode inference;
  DP_CHECK(input_ids.defined() && input_ids.dim() == 2, "T5 encoder: input_ids must be (batch, sequence), got ",
           input_ids.defined() ? input_ids.sizes() : at::IntArrayRef{});
  DP_CHECK(!at::isFloatingType(input_ids.scalar_type()) && input_ids.scalar_type() != at::kBool,
           "T5 encoder: input_ids must hold integer token ids, got ", input_ids.scalar_type());
  const int64_t seq = input_ids.size(1);
  DP_CHECK(seq >= 1, "T5 encoder: empty sequence");
  if (input_ids.numel() > 0) {
    const int64_t low = input_ids.min().item<int64_t>(), high = input_ids.max().item<int64_t>();
    DP_CHECK(low >= 0 && high < config_.vocab_size, "T5 encoder: token ids must be in [0, ", config_.vocab_size,
             "), got range [", low, ", ", high, "]");
  }

  const at::Tensor ids = input_ids.to(device_, at::kLong);
  // (1, heads, S, S) in the run dtype, shared by every block like the reference's block-0 bias.
  const at::Tensor position_bias =
      at::embedding(relative_attention_bias_, relative_position_buckets(seq, device_)).permute({2, 0, 1}).unsqueeze(0).contiguous();
  at::Tensor hidden = at::embedding(embed_tokens_, ids);
  for (const Block& block : blocks_) hidden = block_forward(block, hidden, position_bias);
  return final_layer_norm_(hidden);
}

}  // namespace dp::models
