#pragma once
// diffusers' AutoencoderKL with DownEncoderBlock2D / UpDecoderBlock2D blocks (FLUX's vae): a ResNet decoder
// with a single-head mid-block attention and nearest-neighbour 2x upsampling, and the matching encoder.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

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

struct VaeDecoder;  // vae_blocks.h
struct VaeEncoder;

class AutoencoderKL {
 public:
  // Reads component_dir/config.json and the weights, converted once to dtype on device. The encoder's
  // weights are read only when with_encoder is true (FLUX text-to-image never encodes).
  static AutoencoderKL load(const std::string& component_dir, at::ScalarType dtype, at::Device device,
                            bool with_encoder = false);

  // The latents the transformer produces, unpacked (B, latent_channels, h, w), to the decoder's input:
  // latents / scaling_factor + shift_factor, as FluxPipeline does before vae.decode.
  at::Tensor unscale_latents(const at::Tensor& latents) const;
  // The inverse, for encoded images: (z - shift_factor) * scaling_factor.
  at::Tensor scale_latents(const at::Tensor& z) const;

  // z: (B, latent_channels, h, w), already unscaled. Returns the image (B, out_channels, h*s, w*s) in the
  // run dtype, nominally in [-1, 1] (not clamped), s = config().spatial_scale().
  at::Tensor decode(const at::Tensor& z) const;

  // The posterior diffusers' encode returns: mean and log-variance (clamped to [-30, 20]), each
  // (B, latent_channels, ceil-halved h, w per down block). Requires load(..., with_encoder = true).
  struct LatentDistribution {
    at::Tensor mean;
    at::Tensor logvar;
  };
  LatentDistribution encode(const at::Tensor& image) const;

  const VaeConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }
  bool has_encoder() const { return encoder_ != nullptr; }

 private:
  AutoencoderKL() = default;

  VaeConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  std::shared_ptr<const VaeDecoder> decoder_;
  std::shared_ptr<const VaeEncoder> encoder_;
  at::Tensor quant_conv_weight_, quant_conv_bias_;  // undefined unless use_quant_conv
  at::Tensor post_quant_conv_weight_, post_quant_conv_bias_;
};

}  // namespace dp::models
