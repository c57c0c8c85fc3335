#include "models/clip/clip_config.h"

#include "core/error.h"
#include "core/json_file.h"
#include "models/activation_names.h"

namespace dp::models {

ClipTextConfig ClipTextConfig::from_json(const nlohmann::json& doc, const std::string& source) {
  ClipTextConfig c;
  c.vocab_size = json_get_or<int64_t>(doc, "vocab_size", c.vocab_size, source);
  c.hidden_size = json_get_or<int64_t>(doc, "hidden_size", c.hidden_size, source);
  c.intermediate_size = json_get_or<int64_t>(doc, "intermediate_size", c.intermediate_size, source);
  c.num_hidden_layers = json_get_or<int64_t>(doc, "num_hidden_layers", c.num_hidden_layers, source);
  c.num_attention_heads = json_get_or<int64_t>(doc, "num_attention_heads", c.num_attention_heads, source);
  c.max_position_embeddings = json_get_or<int64_t>(doc, "max_position_embeddings", c.max_position_embeddings, source);
  c.hidden_act = json_get_or<std::string>(doc, "hidden_act", c.hidden_act, source);
  c.layer_norm_eps = json_get_or<double>(doc, "layer_norm_eps", c.layer_norm_eps, source);
  c.bos_token_id = json_get_or<int64_t>(doc, "bos_token_id", c.bos_token_id, source);
  DP_CHECK(!(doc.contains("eos_token_id") && doc["eos_token_id"].is_array()), source,
           ": eos_token_id must be a single id for CLIPTextModel pooling, got ", doc["eos_token_id"].dump());
  c.eos_token_id = json_get_or<int64_t>(doc, "eos_token_id", c.eos_token_id, source);
  c.pad_token_id = json_get_or<int64_t>(doc, "pad_token_id", c.pad_token_id, source);

  for (auto [name, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                             {"hidden_size", c.hidden_size},
                             {"intermediate_size", c.intermediate_size},
                             {"num_attention_heads", c.num_attention_heads},
                             {"max_position_embeddings", c.max_position_embeddings}}) {
    DP_CHECK(value > 0, source, ": ", name, " must be positive, got ", value);
  }
  DP_CHECK(c.num_hidden_layers >= 0, source, ": num_hidden_layers must be >= 0, got ", c.num_hidden_layers);
  DP_CHECK(c.hidden_size % c.num_attention_heads == 0, source, ": hidden_size ", c.hidden_size,
           " is not a multiple of num_attention_heads ", c.num_attention_heads);
  DP_CHECK(c.layer_norm_eps > 0, source, ": layer_norm_eps must be positive, got ", c.layer_norm_eps);
  check_activation_name(c.hidden_act, text_encoder_activation_names(), source, "activation");  // rejects an unknown name now, not at the first forward
  return c;
}

ClipTextConfig ClipTextConfig::clip_vit_l14() {
  ClipTextConfig c;
  c.vocab_size = 49408;
  c.hidden_size = 768;
  c.intermediate_size = 3072;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 12;
  c.max_position_embeddings = 77;
  c.hidden_act = "quick_gelu";
  c.layer_norm_eps = 1e-5;
  c.bos_token_id = 0;
  c.eos_token_id = 2;
  c.pad_token_id = 1;
  return c;
}

}  // namespace dp::models
