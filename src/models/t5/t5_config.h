#pragma once
// T5EncoderModel's config.json (FLUX's text_encoder_2), parsed without LibTorch.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/parameter_shapes.h"

namespace dp::models {

// config.json of a T5 model: every field the encoder reads. Defaults are T5Config's.
struct T5Config {
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  std::string feed_forward_proj = "relu";  // "<act>" or "gated-<act>"
  // Derived from feed_forward_proj ("gated-gelu" means gelu_new) unless config.json states them, which is
  // what T5Config does too: stored values win.
  std::string dense_act_fn = "relu";
  bool is_gated_act = false;
  int64_t pad_token_id = 0;
  int64_t eos_token_id = 1;

  int64_t inner_dim() const { return num_heads * d_kv; }

  static T5Config from_json(const nlohmann::json& config, const std::string& source);
  // google/t5-v1_1-xxl's encoder, FLUX.1-dev's text_encoder_2.
  static T5Config t5_v1_1_xxl();
};

// Every tensor T5EncoderModel reads, in registration order. The token embedding is listed once, as
// "shared.weight", which save_pretrained keeps of the tied pair; a checkpoint holding only its other name
// loads too (see kT5TiedEmbeddingKey).
ParameterShapes t5_encoder_parameter_shapes(const T5Config& config);
// The encoder's own name for the shared token embedding, read when "shared.weight" is absent.
inline constexpr const char* kT5TiedEmbeddingKey = "encoder.embed_tokens.weight";

}  // namespace dp::models
