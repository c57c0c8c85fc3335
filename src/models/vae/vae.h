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

#include "models/vae/vae_config.h"

namespace dp::models {


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
  // One decode of a small latent of zeros, waited for: its kernels load (once per process, on any thread) so that
  // the first real decode does not pay for them (0.4-0.5 s for a 1024x1024 decode on an H100 otherwise). Returns
  // the seconds it took.
  double warm_up() const;

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
