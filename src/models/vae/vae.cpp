#include "models/vae/vae.h"

#include <c10/core/InferenceMode.h>

#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "core/json_file.h"
#include "io/weight_index.h"
#include "models/module_weights.h"
#include "models/vae/vae_blocks.h"

namespace dp::models {

AutoencoderKL AutoencoderKL::load(const std::string& dir, at::ScalarType dtype, at::Device device, bool with_encoder) {
  DP_CHECK(std::filesystem::is_directory(dir), dir, ": VAE folder not found");
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  AutoencoderKL model;
  model.config_ = VaeConfig::from_json(read_json_file(config_path), config_path);
  model.dtype_ = dtype;
  model.device_ = device;
  const VaeConfig& c = model.config_;
  const VaeActivation act = vae_activation(c.act_fn, config_path);

  auto index = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(dir));
  // The encoder's tensors are read only when it is built (an image-to-image run), not for decoding.
  const ModuleWeights root = ModuleWeights(index, dtype, device).read_ahead([&](const std::string& name) {
    return with_encoder || (name.rfind("encoder.", 0) != 0 && name.rfind("quant_conv.", 0) != 0);
  });
  model.decoder_ = std::make_shared<const VaeDecoder>(VaeDecoder::load(root.child("decoder"), c, act));
  if (c.use_post_quant_conv) {
    const Conv2d conv = Conv2d::load(root, "post_quant_conv", c.latent_channels, c.latent_channels, 1, 1, 0);
    model.post_quant_conv_weight_ = conv.weight;
    model.post_quant_conv_bias_ = conv.bias;
  }
  if (with_encoder) {
    model.encoder_ = std::make_shared<const VaeEncoder>(VaeEncoder::load(root.child("encoder"), c, act));
    if (c.use_quant_conv) {
      const int64_t moments = 2 * c.latent_channels;
      const Conv2d conv = Conv2d::load(root, "quant_conv", moments, moments, 1, 1, 0);
      model.quant_conv_weight_ = conv.weight;
      model.quant_conv_bias_ = conv.bias;
    }
  }
  return model;
}

at::Tensor AutoencoderKL::unscale_latents(const at::Tensor& latents) const {
  c10::InferenceMode inference;
  const at::Tensor unscaled = latents / config_.scaling_factor;
  return config_.shift_factor ? unscaled + *config_.shift_factor : unscaled;
}

at::Tensor AutoencoderKL::scale_latents(const at::Tensor& z) const {
  c10::InferenceMode inference;
  return (config_.shift_factor ? z - *config_.shift_factor : z) * config_.scaling_factor;
}

at::Tensor AutoencoderKL::decode(const at::Tensor& z) const {
  c10::InferenceMode inference;
  DP_CHECK(z.defined() && z.dim() == 4 && z.size(1) == config_.latent_channels && z.size(2) > 0 && z.size(3) > 0,
           "VAE decode: expected latents (batch, ", config_.latent_channels, ", height, width), got ",
           z.defined() ? z.sizes() : at::IntArrayRef{});
  at::Tensor latents = z.to(device_, dtype_);
  if (post_quant_conv_weight_.defined()) latents = at::conv2d(latents, post_quant_conv_weight_, post_quant_conv_bias_);
  return (*decoder_)(latents);
}

double AutoencoderKL::warm_up() const {
  c10::InferenceMode inference;
  const auto started = std::chrono::steady_clock::now();
  // 8x8 latents: every layer of the decoder runs, up- and down-sampling included, at a few megabytes.
  const at::Tensor z = at::zeros({1, config_.latent_channels, 8, 8}, at::TensorOptions().dtype(dtype_).device(device_));
  (void)decode(z).sum().item<float>();  // waits for the device
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

AutoencoderKL::LatentDistribution AutoencoderKL::encode(const at::Tensor& image) const {
  c10::InferenceMode inference;
  DP_CHECK(encoder_ != nullptr, "VAE encode: the encoder was not loaded (AutoencoderKL::load with_encoder = true)");
  DP_CHECK(image.defined() && image.dim() == 4 && image.size(1) == config_.in_channels && image.size(2) > 0 &&
               image.size(3) > 0,
           "VAE encode: expected an image (batch, ", config_.in_channels, ", height, width), got ",
           image.defined() ? image.sizes() : at::IntArrayRef{});
  at::Tensor moments = (*encoder_)(image.to(device_, dtype_));
  if (quant_conv_weight_.defined()) moments = at::conv2d(moments, quant_conv_weight_, quant_conv_bias_);
  const auto halves = moments.chunk(2, 1);
  return {halves[0], at::clamp(halves[1], -30.0, 20.0)};
}

}  // namespace dp::models
