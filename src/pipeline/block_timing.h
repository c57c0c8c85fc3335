#pragma once
// Timing one block of each kind, the embedders and the output layers of a FLUX transformer on a device, at a
// run's shape and microbatch size: what `diffpipe calibrate` records and what `generate --calibrate-on-load`
// measures before the ranks load their blocks. Loads only the first double block, the first single block, the
// embedders and the head (every block of a kind has the same shapes, so one of each times them all).
#include <ATen/ATen.h>

#include <memory>

#include "io/weight_index.h"
#include "models/flux/flux_config.h"
#include "pipeline/latent_layout.h"

namespace dp::pipeline {

// Milliseconds for one forward of each unit on a whole microbatch: the median of `repeat` runs after `warmup`.
struct BlockTimes {
  double embedders_ms = 0, double_block_ms = 0, single_block_ms = 0, output_ms = 0;
  int runs = 0;
};

struct BlockTimingRequest {
  std::shared_ptr<const io::WeightIndex> weights;
  models::FluxConfig config;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  LatentGrid grid;
  int64_t text_tokens = 512;
  int64_t microbatch = 1;
  int warmup = 2;
  int repeat = 5;
  // > 0: fewer timed runs (at least one) once this many seconds have passed since the call began, so that a
  // bounded caller (--calibrate-on-load) stays within its budget on a slow device.
  double max_seconds = 0;
};

BlockTimes time_flux_blocks(const BlockTimingRequest& request);

}  // namespace dp::pipeline
