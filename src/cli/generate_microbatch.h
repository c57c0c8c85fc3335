#pragma once
// generate --microbatch-size 0: the size with the most simulated images/s for this run's images, world and memory
// caps (placement/microbatch_choice.h), from this device's calibration when one matches the run's shape.
#include <ATen/ATen.h>

#include <cstdint>

#include "pipeline/flux_pipeline.h"
#include "runtime/distributed_generate.h"

namespace dp::cli {

// Every rank computes the same choice from the same files (the request agreement then checks it). Logs the
// choice and the reason on the coordinator.
int64_t choose_generate_microbatch(const runtime::RuntimeOptions& options, const pipeline::GenerateRequest& request,
                                   const pipeline::LatentGrid& grid, const std::string& model_dir, int world_size,
                                   const at::Device& device, bool coordinator);

}  // namespace dp::cli
