#include "models/vae/vae_config.h"

#include "core/error.h"
#include "core/json_file.h"
#include "models/config_limits.h"
#include "models/activation_names.h"

namespace dp::models {

VaeConfig VaeConfig::from_json(const nlohmann::json& doc, const std::string& source) {
  require_json_object(doc, source);
  VaeConfig c;
  c.in_channels = json_get_or<int64_t>(doc, "in_channels", c.in_channels, source);
  c.out_channels = json_get_or<int64_t>(doc, "out_channels", c.out_channels, source);
  c.down_block_types = json_get_or<std::vector<std::string>>(doc, "down_block_types", c.down_block_types, source);
  c.up_block_types = json_get_or<std::vector<std::string>>(doc, "up_block_types", c.up_block_types, source);
  c.block_out_channels = json_get_or<std::vector<int64_t>>(doc, "block_out_channels", c.block_out_channels, source);
  c.layers_per_block = json_get_or<int64_t>(doc, "layers_per_block", c.layers_per_block, source);
  c.act_fn = json_get_or<std::string>(doc, "act_fn", c.act_fn, source);
  c.latent_channels = json_get_or<int64_t>(doc, "latent_channels", c.latent_channels, source);
  c.norm_num_groups = json_get_or<int64_t>(doc, "norm_num_groups", c.norm_num_groups, source);
  // An int, or [height, width] in some configs; only tiling reads it, so only its type is checked.
  if (doc.contains("sample_size") && doc["sample_size"].is_array()) {
    const auto sizes = json_get<std::vector<int64_t>>(doc, "sample_size", source);
    DP_CHECK(!sizes.empty(), source, ": field 'sample_size' is an empty list");
    c.sample_size = sizes.front();
  } else {
    c.sample_size = json_get_or<int64_t>(doc, "sample_size", c.sample_size, source);
  }
  c.scaling_factor = json_get_or<double>(doc, "scaling_factor", c.scaling_factor, source);
  if (doc.contains("shift_factor") && !doc["shift_factor"].is_null()) {
    c.shift_factor = json_get<double>(doc, "shift_factor", source);
  }
  c.latents_mean = json_get_or<std::vector<double>>(doc, "latents_mean", {}, source);
  c.latents_std = json_get_or<std::vector<double>>(doc, "latents_std", {}, source);
  c.force_upcast = json_get_or<bool>(doc, "force_upcast", c.force_upcast, source);
  c.use_quant_conv = json_get_or<bool>(doc, "use_quant_conv", c.use_quant_conv, source);
  c.use_post_quant_conv = json_get_or<bool>(doc, "use_post_quant_conv", c.use_post_quant_conv, source);
  c.mid_block_add_attention = json_get_or<bool>(doc, "mid_block_add_attention", c.mid_block_add_attention, source);

  for (auto [name, value] : {std::pair<const char*, int64_t>{"in_channels", c.in_channels},
                             {"out_channels", c.out_channels},
                             {"latent_channels", c.latent_channels},
                             {"norm_num_groups", c.norm_num_groups}}) {
    check_config_size(source, name, value);
  }
  check_config_range(source, "layers_per_block", c.layers_per_block, 1, kMaxConfigLayers);
  const std::size_t levels = c.block_out_channels.size();
  DP_CHECK(levels >= 1 && levels <= 16, source, ": block_out_channels must have 1 to 16 entries, got ", levels);
  for (std::size_t i = 0; i < levels; ++i) {
    const int64_t channels = c.block_out_channels[i];
    DP_CHECK(channels > 0 && channels <= kMaxConfigSize && channels % c.norm_num_groups == 0, source,
             ": block_out_channels[", i, "] must be a positive multiple of norm_num_groups ", c.norm_num_groups,
             " (group norm) up to ", kMaxConfigSize, ", got ", channels);
  }
  DP_CHECK(c.down_block_types.size() == levels && c.up_block_types.size() == levels, source,
           ": down_block_types (", c.down_block_types.size(), ") and up_block_types (", c.up_block_types.size(),
           ") must each have one entry per block_out_channels entry (", levels, ")");
  for (const auto& type : c.down_block_types) {
    DP_CHECK(type == "DownEncoderBlock2D", source, ": unsupported down block type '", type,
             "' (only DownEncoderBlock2D)");
  }
  for (const auto& type : c.up_block_types) {
    DP_CHECK(type == "UpDecoderBlock2D", source, ": unsupported up block type '", type, "' (only UpDecoderBlock2D)");
  }
  DP_CHECK(c.scaling_factor != 0.0, source, ": scaling_factor must not be zero");
  check_activation_name(c.act_fn, vae_activation_names(), source, "act_fn");
  return c;
}

VaeConfig VaeConfig::flux() {
  VaeConfig c;
  c.in_channels = 3;
  c.out_channels = 3;
  c.down_block_types.assign(4, "DownEncoderBlock2D");
  c.up_block_types.assign(4, "UpDecoderBlock2D");
  c.block_out_channels = {128, 256, 512, 512};
  c.layers_per_block = 2;
  c.act_fn = "silu";
  c.latent_channels = 16;
  c.norm_num_groups = 32;
  c.sample_size = 1024;
  c.scaling_factor = 0.3611;
  c.shift_factor = 0.1159;
  c.force_upcast = true;
  c.use_quant_conv = false;
  c.use_post_quant_conv = false;
  c.mid_block_add_attention = true;
  return c;
}

namespace {

// ResnetBlock2D without time embedding; the 1x1 shortcut exists only when the channel count changes.
void add_vae_resnet(ParameterShapes& out, const std::string& p, int64_t in, int64_t out_channels) {
  add_norm(out, p + ".norm1", in);
  add_conv(out, p + ".conv1", in, out_channels, 3);
  add_norm(out, p + ".norm2", out_channels);
  add_conv(out, p + ".conv2", out_channels, out_channels, 3);
  if (in != out_channels) add_conv(out, p + ".conv_shortcut", in, out_channels, 1);
}

void add_vae_mid_block(ParameterShapes& out, const std::string& p, int64_t channels, bool with_attention) {
  add_vae_resnet(out, p + ".resnets.0", channels, channels);
  if (with_attention) {
    const std::string a = p + ".attentions.0";
    add_norm(out, a + ".group_norm", channels);
    for (const char* proj : {".to_q", ".to_k", ".to_v", ".to_out.0"}) add_linear(out, a + proj, channels, channels);
  }
  add_vae_resnet(out, p + ".resnets.1", channels, channels);
}

void add_vae_encoder(ParameterShapes& out, const VaeConfig& c) {
  const auto& channels = c.block_out_channels;
  add_conv(out, "encoder.conv_in", c.in_channels, channels[0], 3);
  int64_t in = channels[0];
  for (size_t i = 0; i < channels.size(); ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      add_vae_resnet(out, p + ".resnets." + std::to_string(j), j == 0 ? in : channels[i], channels[i]);
    }
    if (i + 1 < channels.size()) add_conv(out, p + ".downsamplers.0.conv", channels[i], channels[i], 3);
    in = channels[i];
  }
  add_vae_mid_block(out, "encoder.mid_block", channels.back(), c.mid_block_add_attention);
  add_norm(out, "encoder.conv_norm_out", channels.back());
  add_conv(out, "encoder.conv_out", channels.back(), 2 * c.latent_channels, 3);  // mean and log-variance
}

void add_vae_decoder(ParameterShapes& out, const VaeConfig& c) {
  const std::vector<int64_t> channels(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  add_conv(out, "decoder.conv_in", c.latent_channels, channels[0], 3);
  add_vae_mid_block(out, "decoder.mid_block", channels[0], c.mid_block_add_attention);
  int64_t in = channels[0];
  for (size_t i = 0; i < channels.size(); ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    // UpDecoderBlock2D holds one resnet more than layers_per_block.
    for (int64_t j = 0; j <= c.layers_per_block; ++j) {
      add_vae_resnet(out, p + ".resnets." + std::to_string(j), j == 0 ? in : channels[i], channels[i]);
    }
    if (i + 1 < channels.size()) add_conv(out, p + ".upsamplers.0.conv", channels[i], channels[i], 3);
    in = channels[i];
  }
  add_norm(out, "decoder.conv_norm_out", channels.back());
  add_conv(out, "decoder.conv_out", channels.back(), c.out_channels, 3);
}

}  // namespace

ParameterShapes vae_parameter_shapes(const VaeConfig& c, VaeParts parts) {
  DP_CHECK(!c.block_out_channels.empty(), "VAE config: block_out_channels is empty");
  ParameterShapes out;
  const bool encoder = parts == VaeParts::encoder_and_decoder;
  if (encoder) add_vae_encoder(out, c);
  add_vae_decoder(out, c);
  if (encoder && c.use_quant_conv) add_conv(out, "quant_conv", 2 * c.latent_channels, 2 * c.latent_channels, 1);
  if (c.use_post_quant_conv) add_conv(out, "post_quant_conv", c.latent_channels, c.latent_channels, 1);
  return out;
}

}  // namespace dp::models
