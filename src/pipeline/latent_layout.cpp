#include "pipeline/latent_layout.h"

#include <utility>

#include "core/error.h"
#include "core/log.h"

namespace dp::pipeline {

int64_t default_image_size(int64_t vae_scale_factor) {
  DP_CHECK(vae_scale_factor >= 1, "vae_scale_factor must be at least 1, got ", vae_scale_factor);
  return kDefaultSampleSize * vae_scale_factor;
}

LatentGrid latent_grid(int64_t image_height, int64_t image_width, int64_t vae_scale_factor) {
  DP_CHECK(vae_scale_factor >= 1, "vae_scale_factor must be at least 1, got ", vae_scale_factor);
  // The VAE downsamples by vae_scale_factor and packing takes 2x2 latent patches.
  const int64_t multiple = vae_scale_factor * 2;
  for (const auto& [name, size] : {std::pair<const char*, int64_t>{"height", image_height}, {"width", image_width}})
    DP_CHECK(size >= multiple, name, " must be at least ", multiple, " (2 x vae_scale_factor ", vae_scale_factor,
             ": one 2x2 patch of latent pixels), got ", size);
  const LatentGrid grid{2 * (image_height / multiple), 2 * (image_width / multiple), vae_scale_factor};
  if (image_height % multiple != 0 || image_width % multiple != 0)
    DP_WARN("height and width should be multiples of ", multiple, " (2 x vae_scale_factor ", vae_scale_factor,
            ") but are ", image_height, " and ", image_width, "; rounded down to height ", grid.image_height(),
            ", width ", grid.image_width(), ", as diffusers does");
  return grid;
}

at::Tensor latent_image_ids(const LatentGrid& grid) {
  const int64_t rows = grid.height / 2, cols = grid.width / 2;
  at::Tensor ids = at::zeros({rows, cols, 3});
  ids.select(2, 1).add_(at::arange(rows, at::kFloat).unsqueeze(1));
  ids.select(2, 2).add_(at::arange(cols, at::kFloat).unsqueeze(0));
  return ids.reshape({rows * cols, 3});
}

at::Tensor pack_latents(const at::Tensor& latents) {
  DP_CHECK(latents.dim() == 4 && latents.size(2) % 2 == 0 && latents.size(3) % 2 == 0,
           "latents must be (B, C, h, w) with even h and w, got ", latents.sizes());
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(2), w = latents.size(3);
  return latents.view({b, c, h / 2, 2, w / 2, 2}).permute({0, 2, 4, 1, 3, 5}).reshape({b, (h / 2) * (w / 2), c * 4});
}

at::Tensor unpack_latents(const at::Tensor& packed, const LatentGrid& grid) {
  DP_CHECK(packed.dim() == 3 && packed.size(1) == grid.tokens() && packed.size(2) % 4 == 0,
           "packed latents must be (B, ", grid.tokens(), ", 4C), got ", packed.sizes());
  const int64_t b = packed.size(0), c = packed.size(2) / 4;
  return packed.view({b, grid.height / 2, grid.width / 2, c, 2, 2})
      .permute({0, 3, 1, 4, 2, 5})
      .reshape({b, c, grid.height, grid.width});
}

}  // namespace dp::pipeline
