#include "models/t5/t5_config.h"

#include "core/error.h"
#include "core/json_file.h"
#include "models/activation_names.h"

namespace dp::models {

T5Config T5Config::from_json(const nlohmann::json& doc, const std::string& source) {
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
                             {"num_heads", c.num_heads}}) {
    DP_CHECK(value > 0, source, ": ", name, " must be positive, got ", value);
  }
  DP_CHECK(c.num_layers >= 1, source, ": num_layers must be >= 1 (block 0 holds the position bias), got ",
           c.num_layers);
  // Bidirectional buckets: half per direction, half of those exact; the log-spaced rest needs
  // max_distance beyond the exact range.
  DP_CHECK(c.relative_attention_num_buckets >= 4, source, ": relative_attention_num_buckets must be >= 4, got ",
           c.relative_attention_num_buckets);
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

}  // namespace dp::models
