#include "models/t5/t5_config.h"

#include "core/error.h"
#include "core/json_file.h"
#include "models/config_limits.h"
#include "models/activation_names.h"

namespace dp::models {

T5Config T5Config::from_json(const nlohmann::json& doc, const std::string& source) {
  require_json_object(doc, source);
  T5Config c;
  c.vocab_size = json_get_or<int64_t>(doc, "vocab_size", c.vocab_size, source);
  c.d_model = json_get_or<int64_t>(doc, "d_model", c.d_model, source);
  c.d_kv = json_get_or<int64_t>(doc, "d_kv", c.d_kv, source);
  c.d_ff = json_get_or<int64_t>(doc, "d_ff", c.d_ff, source);
  c.num_layers = json_get_or<int64_t>(doc, "num_layers", c.num_layers, source);
  c.num_heads = json_get_or<int64_t>(doc, "num_heads", c.num_heads, source);
  c.relative_attention_num_buckets =
      json_get_or<int64_t>(doc, "relative_attention_num_buckets", c.relative_attention_num_buckets, source);
  c.relative_attention_max_distance =
      json_get_or<int64_t>(doc, "relative_attention_max_distance", c.relative_attention_max_distance, source);
  c.layer_norm_epsilon = json_get_or<double>(doc, "layer_norm_epsilon", c.layer_norm_epsilon, source);
  c.feed_forward_proj = json_get_or<std::string>(doc, "feed_forward_proj", c.feed_forward_proj, source);
  c.pad_token_id = json_get_or<int64_t>(doc, "pad_token_id", c.pad_token_id, source);
  if (!(doc.contains("eos_token_id") && doc["eos_token_id"].is_array())) {
    c.eos_token_id = json_get_or<int64_t>(doc, "eos_token_id", c.eos_token_id, source);
  }

  // T5Config accepts "<act>" or "gated-<act>" only.
  const std::string& proj = c.feed_forward_proj;
  const auto dash = proj.find('-');
  const bool two_parts = dash != std::string::npos;
  DP_CHECK(!two_parts || (proj.substr(0, dash) == "gated" && proj.find('-', dash + 1) == std::string::npos &&
                          dash + 1 < proj.size()),
           source, ": feed_forward_proj '", proj, "' must be '<act>' or 'gated-<act>', e.g. 'relu' or 'gated-gelu'");
  const std::string derived_act = proj == "gated-gelu" ? "gelu_new" : (two_parts ? proj.substr(dash + 1) : proj);
  c.dense_act_fn = json_get_or<std::string>(doc, "dense_act_fn", derived_act, source);
  c.is_gated_act = json_get_or<bool>(doc, "is_gated_act", two_parts, source);

  for (auto [name, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                             {"d_model", c.d_model},
                             {"d_kv", c.d_kv},
                             {"d_ff", c.d_ff},
                             {"num_heads", c.num_heads},
                             {"relative_attention_max_distance", c.relative_attention_max_distance}}) {
    check_config_size(source, name, value);
  }
  // Block 0 holds the position bias every block uses.
  check_config_range(source, "num_layers", c.num_layers, 1, kMaxConfigLayers);
  DP_CHECK(c.inner_dim() <= kMaxConfigSize, source, ": num_heads x d_kv = ", c.num_heads, " x ", c.d_kv, " exceeds ",
           kMaxConfigSize);
  // Bidirectional buckets: half per direction, half of those exact; the log-spaced rest needs
  // max_distance beyond the exact range.
  check_config_range(source, "relative_attention_num_buckets", c.relative_attention_num_buckets, 4, kMaxConfigSize);
  DP_CHECK(c.relative_attention_max_distance > c.relative_attention_num_buckets / 4, source,
           ": relative_attention_max_distance ", c.relative_attention_max_distance,
           " must exceed the exact-bucket range ", c.relative_attention_num_buckets / 4);
  DP_CHECK(c.layer_norm_epsilon > 0, source, ": layer_norm_epsilon must be positive, got ", c.layer_norm_epsilon);
  check_activation_name(c.dense_act_fn, text_encoder_activation_names(), source, "activation");
  return c;
}

T5Config T5Config::t5_v1_1_xxl() {
  T5Config c;
  c.vocab_size = 32128;
  c.d_model = 4096;
  c.d_kv = 64;
  c.d_ff = 10240;
  c.num_layers = 24;
  c.num_heads = 64;
  c.relative_attention_num_buckets = 32;
  c.relative_attention_max_distance = 128;
  c.layer_norm_epsilon = 1e-6;
  c.feed_forward_proj = "gated-gelu";
  c.dense_act_fn = "gelu_new";
  c.is_gated_act = true;
  c.pad_token_id = 0;
  c.eos_token_id = 1;
  return c;
}

ParameterShapes t5_encoder_parameter_shapes(const T5Config& c) {
  const int64_t d = c.d_model, inner = c.inner_dim();
  ParameterShapes out;
  add_parameter(out, "shared.weight", {c.vocab_size, d});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "encoder.block." + std::to_string(i) + ".layer";
    for (const char* proj : {".0.SelfAttention.q", ".0.SelfAttention.k", ".0.SelfAttention.v"}) {
      add_linear(out, p + proj, d, inner, false);
    }
    add_linear(out, p + ".0.SelfAttention.o", inner, d, false);
    // Only block 0 owns the relative position bias; the others reuse it.
    if (i == 0) {
      add_parameter(out, p + ".0.SelfAttention.relative_attention_bias.weight",
                    {c.relative_attention_num_buckets, c.num_heads});
    }
    add_parameter(out, p + ".0.layer_norm.weight", {d});
    if (c.is_gated_act) {
      add_linear(out, p + ".1.DenseReluDense.wi_0", d, c.d_ff, false);
      add_linear(out, p + ".1.DenseReluDense.wi_1", d, c.d_ff, false);
    } else {
      add_linear(out, p + ".1.DenseReluDense.wi", d, c.d_ff, false);
    }
    add_linear(out, p + ".1.DenseReluDense.wo", c.d_ff, d, false);
    add_parameter(out, p + ".1.layer_norm.weight", {d});
  }
  add_parameter(out, "encoder.final_layer_norm.weight", {d});
  return out;
}

}  // namespace dp::models
