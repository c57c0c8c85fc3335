#include "models/flux/flux_config.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/json_file.h"
#include "models/config_limits.h"

namespace dp::models {

FluxConfig FluxConfig::from_json(const nlohmann::json& doc, const std::string& source) {
  require_json_object(doc, source);
  FluxConfig c;
  c.patch_size = json_get_or<int64_t>(doc, "patch_size", c.patch_size, source);
  c.in_channels = json_get_or<int64_t>(doc, "in_channels", c.in_channels, source);
  c.out_channels = json_get_or<int64_t>(doc, "out_channels", 0, source);
  c.num_layers = json_get_or<int64_t>(doc, "num_layers", c.num_layers, source);
  c.num_single_layers = json_get_or<int64_t>(doc, "num_single_layers", c.num_single_layers, source);
  c.attention_head_dim = json_get_or<int64_t>(doc, "attention_head_dim", c.attention_head_dim, source);
  c.num_attention_heads = json_get_or<int64_t>(doc, "num_attention_heads", c.num_attention_heads, source);
  c.joint_attention_dim = json_get_or<int64_t>(doc, "joint_attention_dim", c.joint_attention_dim, source);
  c.pooled_projection_dim = json_get_or<int64_t>(doc, "pooled_projection_dim", c.pooled_projection_dim, source);
  c.guidance_embeds = json_get_or<bool>(doc, "guidance_embeds", c.guidance_embeds, source);
  c.axes_dims_rope = json_get_or<std::vector<int64_t>>(doc, "axes_dims_rope", c.axes_dims_rope, source);

  for (auto [name, value] : {std::pair<const char*, int64_t>{"in_channels", c.in_channels},
                             {"attention_head_dim", c.attention_head_dim},
                             {"num_attention_heads", c.num_attention_heads},
                             {"joint_attention_dim", c.joint_attention_dim},
                             {"pooled_projection_dim", c.pooled_projection_dim}}) {
    check_config_size(source, name, value);
  }
  // diffusers reads out_channels 0 like null: "out_channels or in_channels".
  check_config_range(source, "out_channels", c.out_channels, 0, kMaxConfigSize);
  // proj_out is patch_size^2 x out_channels wide: bounded like any size, and computed without overflow.
  check_config_range(source, "patch_size", c.patch_size, 1, 4096);
  DP_CHECK(c.patch_size * c.patch_size * c.output_channels() <= kMaxConfigSize, source,
           ": patch_size^2 x out_channels = ", c.patch_size, "^2 x ", c.output_channels(), " exceeds ", kMaxConfigSize);
  check_config_range(source, "num_layers", c.num_layers, 0, kMaxConfigLayers);
  check_config_range(source, "num_single_layers", c.num_single_layers, 0, kMaxConfigLayers);
  // The packed width every block works in: kept within one size bound so that 4 x and 5 x it stay exact.
  DP_CHECK(c.inner_dim() <= kMaxConfigSize, source, ": num_attention_heads x attention_head_dim = ",
           c.num_attention_heads, " x ", c.attention_head_dim, " exceeds ", kMaxConfigSize);
  DP_CHECK(c.attention_head_dim % 2 == 0, source, ": attention_head_dim must be even for RoPE, got ",
           c.attention_head_dim);
  DP_CHECK(c.axes_dims_rope.size() == 3, source, ": axes_dims_rope must have 3 entries (text/row/column ids), got ",
           c.axes_dims_rope.size());
  int64_t rope_sum = 0;
  for (std::size_t i = 0; i < c.axes_dims_rope.size(); ++i) {
    const int64_t d = c.axes_dims_rope[i];
    DP_CHECK(d > 0 && d % 2 == 0 && d <= c.attention_head_dim, source, ": axes_dims_rope[", i,
             "] must be positive, even and at most attention_head_dim, got ", d);
    rope_sum += d;
  }
  DP_CHECK(rope_sum == c.attention_head_dim, source, ": axes_dims_rope sums to ", rope_sum,
           " but attention_head_dim is ", c.attention_head_dim);
  return c;
}

nlohmann::json FluxConfig::to_json() const {
  return {{"_class_name", "FluxTransformer2DModel"},
          {"patch_size", patch_size},
          {"in_channels", in_channels},
          {"out_channels", out_channels > 0 ? nlohmann::json(out_channels) : nlohmann::json(nullptr)},
          {"num_layers", num_layers},
          {"num_single_layers", num_single_layers},
          {"attention_head_dim", attention_head_dim},
          {"num_attention_heads", num_attention_heads},
          {"joint_attention_dim", joint_attention_dim},
          {"pooled_projection_dim", pooled_projection_dim},
          {"guidance_embeds", guidance_embeds},
          {"axes_dims_rope", axes_dims_rope}};
}

FluxConfig FluxConfig::flux_dev() { return FluxConfig{}; }

namespace {

void add_timestep_embedding(std::vector<ParameterShape>& out, const std::string& name, int64_t dim) {
  add_linear(out, name + ".linear_1", 256, dim);
  add_linear(out, name + ".linear_2", dim, dim);
}

void add_attention(std::vector<ParameterShape>& out, const std::string& p, int64_t dim, int64_t head_dim,
                   bool joint) {
  // FluxAttention registers norm_q/norm_k, to_q/to_k/to_v, to_out, then the added (text) projections.
  out.push_back({p + ".norm_q.weight", {head_dim}});
  out.push_back({p + ".norm_k.weight", {head_dim}});
  add_linear(out, p + ".to_q", dim, dim);
  add_linear(out, p + ".to_k", dim, dim);
  add_linear(out, p + ".to_v", dim, dim);
  if (!joint) return;
  add_linear(out, p + ".to_out.0", dim, dim);
  out.push_back({p + ".norm_added_q.weight", {head_dim}});
  out.push_back({p + ".norm_added_k.weight", {head_dim}});
  add_linear(out, p + ".add_q_proj", dim, dim);
  add_linear(out, p + ".add_k_proj", dim, dim);
  add_linear(out, p + ".add_v_proj", dim, dim);
  add_linear(out, p + ".to_add_out", dim, dim);
}

}  // namespace

bool flux_fp8_gemm_weight(const std::string& name, const std::vector<int64_t>& shape) {
  // As fp8_gemm.cpp's to_fp8 takes them: q|k|v (each stream), the attention outputs and the MLPs of a double
  // block; q|k|v, proj_mlp and proj_out of a single block. Their modulation rows (norm1, norm) stay.
  static const std::vector<std::string> double_block = {
      "attn.to_q.weight",       "attn.to_k.weight",       "attn.to_v.weight",       "attn.add_q_proj.weight",
      "attn.add_k_proj.weight", "attn.add_v_proj.weight", "attn.to_out.0.weight",   "attn.to_add_out.weight",
      "ff.net.0.proj.weight",   "ff.net.2.weight",        "ff_context.net.0.proj.weight", "ff_context.net.2.weight"};
  static const std::vector<std::string> single_block = {"attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight",
                                                        "proj_mlp.weight", "proj_out.weight"};
  constexpr int64_t kGranularity = 16;  // the tensor cores' FP8 granularity
  if (shape.size() != 2 || shape[0] % kGranularity != 0 || shape[1] % kGranularity != 0) return false;
  const auto in_block = [&](const std::string& prefix, const std::vector<std::string>& suffixes) {
    if (name.compare(0, prefix.size(), prefix) != 0) return false;
    const std::size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos || dot == prefix.size()) return false;
    const std::string rest = name.substr(dot + 1);
    return std::find(suffixes.begin(), suffixes.end(), rest) != suffixes.end();
  };
  return in_block("transformer_blocks.", double_block) || in_block("single_transformer_blocks.", single_block);
}

int64_t flux_fp8_gemm_weight_bytes(const std::vector<int64_t>& shape) {
  DP_CHECK(shape.size() == 2, "an FP8 weight is a matrix, got ", shape.size(), " dimensions");
  return shape[0] * shape[1] + shape[0] * static_cast<int64_t>(sizeof(float));
}

std::vector<ParameterShape> flux_parameter_shapes(const FluxConfig& c) {
  const int64_t dim = c.inner_dim();
  std::vector<ParameterShape> out;
  add_timestep_embedding(out, "time_text_embed.timestep_embedder", dim);
  if (c.guidance_embeds) add_timestep_embedding(out, "time_text_embed.guidance_embedder", dim);
  add_linear(out, "time_text_embed.text_embedder.linear_1", c.pooled_projection_dim, dim);
  add_linear(out, "time_text_embed.text_embedder.linear_2", dim, dim);
  add_linear(out, "context_embedder", c.joint_attention_dim, dim);
  add_linear(out, "x_embedder", c.in_channels, dim);  // patch_size scales only proj_out
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i);
    add_linear(out, p + ".norm1.linear", dim, 6 * dim);
    add_linear(out, p + ".norm1_context.linear", dim, 6 * dim);
    add_attention(out, p + ".attn", dim, c.attention_head_dim, true);
    add_linear(out, p + ".ff.net.0.proj", dim, 4 * dim);
    add_linear(out, p + ".ff.net.2", 4 * dim, dim);
    add_linear(out, p + ".ff_context.net.0.proj", dim, 4 * dim);
    add_linear(out, p + ".ff_context.net.2", 4 * dim, dim);
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string p = "single_transformer_blocks." + std::to_string(i);
    add_linear(out, p + ".norm.linear", dim, 3 * dim);
    add_linear(out, p + ".proj_mlp", dim, c.mlp_hidden_dim());
    add_linear(out, p + ".proj_out", dim + c.mlp_hidden_dim(), dim);
    add_attention(out, p + ".attn", dim, c.attention_head_dim, false);
  }
  add_linear(out, "norm_out.linear", dim, 2 * dim);
  add_linear(out, "proj_out", dim, c.patch_size * c.patch_size * c.output_channels());
  return out;
}

std::vector<std::string> flux_top_level_modules() {
  return {"pos_embed",          "time_text_embed",           "context_embedder", "x_embedder",
          "transformer_blocks", "single_transformer_blocks", "norm_out",         "proj_out"};
}

}  // namespace dp::models
