#pragma once
// How FluxPipeline lays out latents: packing 2x2 patches into tokens and the position ids of those tokens.
#include <ATen/ATen.h>

#include <cstdint>

namespace dp::pipeline {

constexpr int64_t kVaeScaleFactor = 8;

struct LatentGrid {
  int64_t height = 0;  // latent rows, 2 * (H / 16)
  int64_t width = 0;
  int64_t tokens() const { return (height / 2) * (width / 2); }
};

// Validates H and W (positive multiples of 16, as FluxPipeline requires) and returns the latent grid.
LatentGrid latent_grid(int64_t image_height, int64_t image_width);
// (tokens, 3): column 0 zero, column 1 the packed row, column 2 the packed column.
at::Tensor latent_image_ids(const LatentGrid& grid);
// (B, C, h, w) -> (B, h/2 * w/2, 4C) and back.
at::Tensor pack_latents(const at::Tensor& latents);
at::Tensor unpack_latents(const at::Tensor& packed, const LatentGrid& grid);

}  // namespace dp::pipeline
