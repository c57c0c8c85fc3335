#pragma once
// FluxTransformer2DModel's config.json, every field diffusers reads, and the parameter list it implies.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "models/parameter_shapes.h"

namespace dp::models {

struct FluxConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 0;  // 0 in config (null) means in_channels
  int64_t num_layers = 19;
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = true;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t output_channels() const { return out_channels > 0 ? out_channels : in_channels; }
  int64_t mlp_hidden_dim() const { return inner_dim() * 4; }
  int64_t num_blocks() const { return num_layers + num_single_layers; }

  // Parses and validates; `source` names the file in errors.
  static FluxConfig from_json(const nlohmann::json& config, const std::string& source);
  nlohmann::json to_json() const;  // as diffusers writes config.json
  static FluxConfig flux_dev();    // FLUX.1-dev's published architecture
};

// Every parameter of the model in diffusers' registration order (the order accelerate walks modules):
// time_text_embed, context_embedder, x_embedder, transformer_blocks, single_transformer_blocks, norm_out,
// proj_out; within a module, its own parameters in nn.Module order.
std::vector<ParameterShape> flux_parameter_shapes(const FluxConfig& config);

// --fp8-gemms (models/flux/fp8_gemm.h): whether the checkpoint tensor `name` of `shape` is a weight the blocks
// hold in FP8 (e4m3, one byte an element, plus an fp32 scale per output row): the projections of the double and
// single blocks whose sizes are multiples of 16. Planning sizes the converted blocks with it.
bool flux_fp8_gemm_weight(const std::string& name, const std::vector<int64_t>& shape);
// The bytes such a weight occupies once converted.
int64_t flux_fp8_gemm_weight_bytes(const std::vector<int64_t>& shape);

// The top-level module names in registration order, pos_embed (no parameters) included.
std::vector<std::string> flux_top_level_modules();

}  // namespace dp::models
