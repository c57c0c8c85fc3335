#pragma once
// `diffpipe generate` over the MPI world: the same pipeline phases on one rank or N. Every rank plans the
// transformer split from the same headers and checks that the others agree (build, model, plan). Rank 0
// encodes the prompts while the other ranks load their blocks, then drives the denoising ring and decodes.
#include <ATen/ATen.h>

#include <functional>
#include <string>

#include "pipeline/denoise_loop.h"
#include "pipeline/flux_pipeline.h"
#include "runtime/checkpointing.h"

namespace dp::runtime {

class World;

struct RuntimeOptions {
  std::string device_map;   // strategy or JSON map; empty: "pipeline" (time-balanced) over the world
  std::string max_memory;   // --max-memory as `plan` reads it; empty: each rank's device memory
  int64_t microbatch_size = 1;
  double transport_timeout_seconds = 300;
  // --report: each rank writes its figures as JSON here (PATH.rankN.json beside it when there are N > 1 ranks).
  std::string report_path;
  CheckpointOptions checkpoints;
};

struct GenerateOutcome {
  // A stop signal ended the denoising: the checkpoint was written, no output was (every rank knows).
  bool stopped = false;
  std::string checkpoint;  // coordinator: the checkpoint written at the stop
};

struct Outputs {
  // Coordinator only, once the batch's latents are final (B, N_img, C).
  std::function<void(const at::Tensor& latents)> on_latents;
  // Coordinator only, when decoding: 8-bit RGB images (B, H, W, 3).
  std::function<void(const at::Tensor& images)> on_images;
  std::function<void(const pipeline::LoopProgress&)> on_step;
};

// Runs the whole request on this rank (from options.checkpoints.resume when set: its latents, step per image
// and prompt embeddings; no text encoder runs) (World::init first; run it inside World::run_guarded so that a failure
// on any rank ends the job everywhere). Only the coordinator calls `outputs`.
// `grid` is the request's latent grid (FluxPipeline::resolve_image_size).
GenerateOutcome distributed_generate(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                          const pipeline::LatentGrid& grid, const RuntimeOptions& options, const Outputs& outputs);

// The device this rank computes on: `requested` itself on CPU; on CUDA, GPU local_rank % visible GPUs (one
// GPU per rank on a full node, several ranks on one GPU when there are fewer GPUs than ranks).
at::Device rank_device(const at::Device& requested, const World& world);

// Identifies this build for the ranks' agreement check: version, git revision, compile time.
std::string build_id();
// Identifies a model folder's transformer: its config and every tensor's name, dtype, shape and offsets.
std::string model_fingerprint(const std::string& transformer_dir);

}  // namespace dp::runtime
