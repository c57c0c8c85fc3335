#include "models/clip/clip_config.h"

#include "core/error.h"
#include "core/json_file.h"
#include "models/config_limits.h"
#include "models/activation_names.h"

namespace dp::models {

ClipTextConfig ClipTextConfig::from_json(const nlohmann::json& doc, const std::string& source) {
  require_json_object(doc, source);
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
    check_config_size(source, name, value);
  }
  check_config_range(source, "num_hidden_layers", c.num_hidden_layers, 0, kMaxConfigLayers);
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

ParameterShapes clip_text_parameter_shapes(const ClipTextConfig& c) {
  const int64_t d = c.hidden_size;
  ParameterShapes out;
  add_parameter(out, "embeddings.token_embedding.weight", {c.vocab_size, d});
  add_parameter(out, "embeddings.position_embedding.weight", {c.max_position_embeddings, d});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "encoder.layers." + std::to_string(i);
    add_norm(out, p + ".layer_norm1", d);
    for (const char* proj : {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.out_proj"}) {
      add_linear(out, p + proj, d, d);
    }
    add_norm(out, p + ".layer_norm2", d);
    add_linear(out, p + ".mlp.fc1", d, c.intermediate_size);
    add_linear(out, p + ".mlp.fc2", c.intermediate_size, d);
  }
  add_norm(out, "final_layer_norm", d);
  return out;
}

}  // namespace dp::models
