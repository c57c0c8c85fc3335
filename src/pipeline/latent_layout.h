#pragma once
// How FluxPipeline lays out latents: the latent grid of an image size, which depends on the VAE's
// downsampling (vae_scale_factor), packing 2x2 patches into tokens, and the position ids of those tokens.
#include <ATen/ATen.h>

#include <cstdint>

namespace dp::pipeline {

// FluxPipeline's vae_scale_factor when the pipeline has no VAE. With one it is the VAE's own,
// 2 ** (len(block_out_channels) - 1): 8 for FLUX.1's, 1 or 2 for diffusers' tiny test VAEs.
constexpr int64_t kVaeScaleFactorWithoutVae = 8;
// FluxPipeline.default_sample_size: the default height and width are this many latent pixels.
constexpr int64_t kDefaultSampleSize = 128;

struct LatentGrid {
  int64_t height = 0;            // latent rows, 2 * (H // (2 * vae_scale_factor))
  int64_t width = 0;             // latent columns, 2 * (W // (2 * vae_scale_factor))
  int64_t vae_scale_factor = 0;  // image pixels per latent pixel along each axis
  int64_t tokens() const { return (height / 2) * (width / 2); }
  // The size the VAE decodes to: the requested one rounded down to multiples of 2 * vae_scale_factor.
  int64_t image_height() const { return height * vae_scale_factor; }
  int64_t image_width() const { return width * vae_scale_factor; }
};

// FluxPipeline's height and width when none is given: default_sample_size * vae_scale_factor.
int64_t default_image_size(int64_t vae_scale_factor);

// The latent grid of an H x W image, as FluxPipeline.prepare_latents derives it. A size that is not a
// multiple of 2 * vae_scale_factor is rounded down with a warning, as diffusers' check_inputs does; one
// smaller than 2 * vae_scale_factor (no latent patch at all) is refused.
LatentGrid latent_grid(int64_t image_height, int64_t image_width, int64_t vae_scale_factor);
// (tokens, 3): column 0 zero, column 1 the packed row, column 2 the packed column.
at::Tensor latent_image_ids(const LatentGrid& grid);
// (B, C, h, w) -> (B, h/2 * w/2, 4C) and back.
at::Tensor pack_latents(const at::Tensor& latents);
at::Tensor unpack_latents(const at::Tensor& packed, const LatentGrid& grid);

}  // namespace dp::pipeline
