#include "models/vae/vae_config.h"

#include "core/error.h"
#include "core/json_file.h"
#include "models/activation_names.h"

namespace dp::models {

VaeConfig VaeConfig::from_json(const nlohmann::json& doc, const std::string& source) {
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
  c.sample_size = doc.contains("sample_size") && doc["sample_size"].is_array()
                      ? json_get<std::vector<int64_t>>(doc, "sample_size", source).at(0)
                      : json_get_or<int64_t>(doc, "sample_size", c.sample_size, source);
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
                             {"layers_per_block", c.layers_per_block},
                             {"latent_channels", c.latent_channels},
                             {"norm_num_groups", c.norm_num_groups}}) {
    DP_CHECK(value > 0, source, ": ", name, " must be positive, got ", value);
  }
  const std::size_t levels = c.block_out_channels.size();
  DP_CHECK(levels >= 1 && levels <= 16, source, ": block_out_channels must have 1 to 16 entries, got ", levels);
  for (int64_t channels : c.block_out_channels) {
    DP_CHECK(channels > 0 && channels % c.norm_num_groups == 0, source, ": every block_out_channels entry must be a ",
             "positive multiple of norm_num_groups ", c.norm_num_groups, " (group norm), got ", channels);
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

}  // namespace dp::models
