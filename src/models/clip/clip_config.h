#pragma once
// CLIPTextModel's config.json (FLUX's text_encoder), parsed without LibTorch.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/parameter_shapes.h"

namespace dp::models {

// config.json of a CLIPTextModel: every field the text model reads. Defaults are CLIPTextConfig's.
struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  std::string hidden_act = "quick_gelu";
  double layer_norm_eps = 1e-5;
  int64_t bos_token_id = 49406;
  int64_t eos_token_id = 49407;
  int64_t pad_token_id = 1;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Configs written before transformers PR #24773 say eos_token_id 2 (FLUX.1-dev's does); transformers then
  // pools at the largest token id (CLIP's eos is the last vocabulary entry) instead of the first eos id.
  bool pools_at_largest_id() const { return eos_token_id == 2; }

  static ClipTextConfig from_json(const nlohmann::json& config, const std::string& source);
  // openai/clip-vit-large-patch14's text model, FLUX.1-dev's text_encoder, with its config's token ids
  // (bos 0, eos 2 legacy pooling, pad 1).
  static ClipTextConfig clip_vit_l14();
};

// The prefix of the older checkpoint layout (CLIPTextModel wrapping a CLIPTextTransformer, as FLUX.1-dev's
// text_encoder is saved); transformers 5 saves without it. Both load: a checkpoint is prefixed when it holds
// "text_model.embeddings.token_embedding.weight".
inline constexpr const char* kClipTextLegacyPrefix = "text_model";

// Every tensor CLIPTextModel reads, in registration order, as transformers 5 saves it (no prefix).
ParameterShapes clip_text_parameter_shapes(const ClipTextConfig& config);

}  // namespace dp::models
