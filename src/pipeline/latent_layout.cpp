#include "pipeline/latent_layout.h"

#include "core/error.h"

namespace dp::pipeline {

LatentGrid latent_grid(int64_t image_height, int64_t image_width) {
  const int64_t multiple = kVaeScaleFactor * 2;
  DP_CHECK(image_height > 0 && image_height % multiple == 0, "height must be a positive multiple of ", multiple,
           ", got ", image_height);
  DP_CHECK(image_width > 0 && image_width % multiple == 0, "width must be a positive multiple of ", multiple,
           ", got ", image_width);
  return {2 * (image_height / multiple), 2 * (image_width / multiple)};
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
