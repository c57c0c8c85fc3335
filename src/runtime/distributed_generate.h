#pragma once
// `diffpipe generate` over the MPI world: the same pipeline phases on one rank or N. Every rank plans the
// transformer split from the same headers and checks that the others agree (build, model, plan). The ranks
// --pipeline-device-map names run CLIP and T5 (rank 0 without it) and send their outputs to rank 0, while the
// other ranks load their blocks; rank 0 drives the denoising ring and hands each finished microbatch to the
// rank that decodes, which sends the images back for rank 0 to write.
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
  // "" or "balanced": which ranks run CLIP, T5 and the VAE (runtime/components.h).
  std::string pipeline_device_map;
  int64_t microbatch_size = 1;
  // --calibration: block times from `diffpipe calibrate` for the "pipeline" split when an entry matches this run
  // (this rank's device name, dtype, size, text tokens, microbatch); empty: the default file when it exists.
  std::string calibration;
  bool no_calibration = false;
  // --calibrate-on-load: rank 0 times one block of each kind on its device before any rank loads (bounded to
  // 2 s), and every rank re-plans the "pipeline" split from those times and agrees on it (agree_phase.cpp).
  bool calibrate_on_load = false;
  // --sequence-parallel K: the world is S stage groups x K ranks (runtime/mesh_layout.h); the device map plans the
  // S groups (GPU d is group d) and the K ranks of a group split each image's tokens (Ulysses attention).
  int sequence_parallel = 1;
  double transport_timeout_seconds = 300;
  // --transport: auto, nccl or mpi (see choose_transport).
  std::string transport = "auto";
  // --report: each rank writes its figures as JSON here (PATH.rankN.json beside it when there are N > 1 ranks).
  std::string report_path;
  // --load-overlap: auto, on or off. On: this rank's transformer blocks load on a thread while its text
  // encoders run (runtime/load_phase.h says when auto chooses it).
  std::string load_overlap = "auto";
  // Run one block of each kind on zeros once the blocks are loaded (FluxStage::warm_up), so that step 1 costs
  // what later steps cost; --no-warm-up turns it off.
  bool warm_up = true;
  // --fp8-gemms: the blocks' projections run as FP8 GEMMs (models/flux/fp8_gemm.h); checked before any load.
  bool fp8_gemms = false;
  // --trace: rank 0 writes every rank's timeline here as Chrome trace-event JSON (runtime/trace_file.h).
  std::string trace_path;
  // --torch-profile: rank 0's first torch_profile_steps steps through LibTorch's profiler (runtime/torch_profile.h).
  std::string torch_profile_path;
  int torch_profile_steps = 3;
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
  // Set on every rank when the run decodes (PNG output). Called on the coordinator only, once per microbatch
  // in order of completion: its 8-bit RGB images (b, H, W, 3), rows [first_row, first_row + b) of the batch,
  // decoded on rank `decoded_on`.
  std::function<void(int64_t first_row, const at::Tensor& images, int decoded_on)> on_images;
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

// The transport a run uses, "nccl" or "mpi". auto: nccl when the device is CUDA, this build has NCCL and there
// are several ranks; else mpi. Throws for an unknown name, and for nccl on the CPU or in a build without NCCL:
// checked before anything is loaded.
std::string choose_transport(const std::string& requested, bool cuda_device, int world_size);
// Whether this build has the NCCL transport (compiled with DIFFPIPE_HAVE_NCCL).
bool built_with_nccl();

// Identifies this build for the ranks' agreement check: version, git revision, compile time.
std::string build_id();
// Identifies a model folder's transformer: its config and every tensor's name, dtype, shape and offsets.
std::string model_fingerprint(const std::string& transformer_dir);
// What a request's LoRA adapters add to that fingerprint ("" without adapters): the ranks agree on both.
std::string adapters_fingerprint(const pipeline::GenerateRequest& request);

}  // namespace dp::runtime
