#pragma once
// AutoencoderKL's config.json (FLUX's vae), parsed without LibTorch.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "models/parameter_shapes.h"

namespace dp::models {

// config.json of an AutoencoderKL: every field the model and FluxPipeline read. Defaults are diffusers'.
struct VaeConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<std::string> down_block_types = {"DownEncoderBlock2D"};
  std::vector<std::string> up_block_types = {"UpDecoderBlock2D"};
  std::vector<int64_t> block_out_channels = {64};
  int64_t layers_per_block = 1;
  std::string act_fn = "silu";
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  int64_t sample_size = 32;  // only used by diffusers' tiling, which we do not implement
  double scaling_factor = 0.18215;
  std::optional<double> shift_factor;  // null in SD configs, 0.1159 in FLUX's
  std::vector<double> latents_mean;    // empty when null; not used by FluxPipeline
  std::vector<double> latents_std;
  bool force_upcast = true;  // read by SD pipelines only; FluxPipeline decodes in the run dtype
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;

  // Image pixels per latent pixel along each axis (diffusers' vae_scale_factor): 8 for FLUX.
  int64_t spatial_scale() const { return int64_t{1} << (block_out_channels.size() - 1); }

  static VaeConfig from_json(const nlohmann::json& config, const std::string& source);
  // FLUX.1-dev's (and schnell's) vae: 16 latent channels, four levels, no quant convolutions.
  static VaeConfig flux();
};

// The halves of the autoencoder a caller reads: FluxPipeline only decodes, and AutoencoderKL::load reads the
// encoder (and quant_conv) only when asked to.
enum class VaeParts { decoder, encoder_and_decoder };

// Every tensor AutoencoderKL reads for `parts`, in registration order: the encoder, the decoder, then the
// quant convolutions the config enables (quant_conv belongs to the encoder side, post_quant_conv to the decoder).
ParameterShapes vae_parameter_shapes(const VaeConfig& config, VaeParts parts = VaeParts::encoder_and_decoder);

}  // namespace dp::models
