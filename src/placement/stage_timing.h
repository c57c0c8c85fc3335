#pragma once
// Time, not bytes: the transformer as a chain of units (embedders, each block, output layers) with a
// predicted compute time, the per-GPU stage times any device map implies, and diffpipe's own "pipeline"
// strategy, which cuts the chain into contiguous stages minimising the slowest stage within each GPU's
// memory (weights plus activation workspace). A pipeline runs at the pace of its slowest stage, so
// efficiency = mean stage time / max stage time.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/flux/flux_config.h"
#include "placement/calibration.h"
#include "placement/auto_device_map.h"
#include "placement/module_tree.h"

namespace dp::placement {

struct TimingModel {
  int64_t height = 1024;
  int64_t width = 1024;
  int64_t batch = 1;
  int64_t text_tokens = 512;   // FLUX pads T5 prompts to max_sequence_length
  double sustained_tflops = 400.0;  // FLOP-only estimate; an H200 sustains about 420 on FLUX blocks in bf16
  // Measured per-block times refine the estimate (H200, bf16, 1024x1024: 3.07 ms double, 2.85 ms single).
  std::optional<double> double_block_ms;
  std::optional<double> single_block_ms;
  int64_t measured_height = 1024;
  int64_t measured_width = 1024;
  double offload_gb_per_s = 25.0;  // weights offloaded to cpu/disk cross PCIe on every use
  // K of a mesh (placement/mesh.h): every figure is then one rank's, in a stage group of K ranks that split the
  // tokens (Ulysses). 1: one GPU per stage, as before.
  int sequence_parallel = 1;
  // Times `diffpipe calibrate` measured at exactly this shape, dtype and microbatch (batch) on the run's device
  // (placement/calibration.h). They replace the FLOP model for every unit; with sequence_parallel K, a rank's
  // share is the calibrated time scaled by the FLOPs of its share. calibration_source names the file and key.
  std::optional<CalibratedTimes> calibrated;
  std::string calibration_source;
  bool measured() const { return double_block_ms.has_value() && single_block_ms.has_value(); }
};

struct TimedUnit {
  std::string name;                  // "embedders", "transformer_blocks.3", "output"
  std::vector<std::string> modules;  // device-map keys it consists of
  int64_t bytes = 0;
  double flops = 0;
  double ms = 0;
};

// FLOPs of one forward pass of each block kind, for one image, done by one rank of a group of
// `sequence_parallel` ranks (1: the whole block on one GPU). How the block splits over K ranks:
//   - the linear layers (q/k/v, out, MLP; 24 d^2 FLOPs per token) run on the rank's own tokens only, so they scale
//     with its token shard; the longest shard sets the group's pace (mesh.h: token_shard, ceil(N / K) tokens);
//   - attention (4 L^2 d over the joint sequence of L tokens) is split by heads: after the all-to-all a rank holds
//     all L tokens of H / K heads, so it does exactly 1/K of it;
//   - the modulation linears run on the one temb vector, which every rank computes in full (replicated);
//   - the all-to-alls themselves move bytes, not FLOPs: the ring simulator adds them (mesh_simulation.h).
// Layer norms, RMSNorm and RoPE are left out at any K, as for one GPU (bandwidth-bound and a few percent).
double double_block_flops(const models::FluxConfig& config, int64_t height, int64_t width, int64_t text_tokens,
                          int sequence_parallel = 1);
double single_block_flops(const models::FluxConfig& config, int64_t height, int64_t width, int64_t text_tokens,
                          int sequence_parallel = 1);

// The units and their times for one rank (timing.sequence_parallel > 1: one rank of a stage group; flops and ms
// are that rank's, bytes the whole unit's, which every rank of the group holds). Measured block times calibrate
// ms per FLOP on one GPU (K = 1) and apply to a rank's share.
std::vector<TimedUnit> flux_timed_units(const models::FluxConfig& config, const ModuleTree& tree,
                                        const TimingModel& timing);

// Activations a stage keeps on its GPU: input and output states for each micro-batch in flight (one per
// stage) plus the largest block's intermediates (qkv, MLP hidden, attention output, the single block's concat).
// With timing.sequence_parallel = K, one rank's: its token shard (the longest); between the all-to-alls it holds
// q, k, v of all L tokens for H / K heads, which is L / K tokens' worth, the same size.
int64_t activation_workspace_bytes(const models::FluxConfig& config, const TimingModel& timing, io::DType dtype,
                                   int num_stages);

struct StageTime {
  Device device;
  int64_t weight_bytes = 0;     // resident on this GPU
  int64_t offloaded_bytes = 0;  // brought in from cpu/disk to run here
  double ms = 0;
  std::string first_unit, last_unit;  // empty for an idle GPU
};

struct TimingReport {
  std::vector<StageTime> stages;  // one per GPU of the world, by index
  double total_ms = 0, max_ms = 0, mean_ms = 0;
  double imbalance() const { return mean_ms > 0 ? max_ms / mean_ms : 0; }
  double efficiency() const { return max_ms > 0 ? mean_ms / max_ms : 0; }
};

// Stage times implied by a resolved placement: each unit runs where its tensors live; offloaded weights run
// on the first GPU (accelerate's execution device) after a transfer.
TimingReport time_placement(const std::vector<TimedUnit>& units, const ModuleTree& tree,
                            const std::map<std::string, Device>& tensor_devices, const std::vector<int>& world_gpus,
                            const TimingModel& timing);

// What a rank's CUDA caching allocator needs beyond the weights and the activation workspace. The runtime caps
// each rank's allocator at its --max-memory entry, so the "pipeline" strategy holds this back from every GPU:
//   - cuBLAS and cuBLASLt workspaces, which LibTorch takes from the same allocator: 32 MiB each per stream,
//     for the compute stream and the stream that copies offloaded blocks in (128 MiB);
//   - while a double block loads, its six separate q/k/v projections live next to their two concatenations
//     (6 d^2 elements: 108 MiB for FLUX.1 in bf16);
//   - what the coordinator keeps on its GPU across phases: prompt embeddings, pooled projections and the
//     latents of a microbatch, the text stream's input per microbatch and the RoPE tables (tens of MiB at
//     1024x1024; 64 MiB is held for them);
//   - the first stage's modulation rows for every step of the microbatches it holds (at most 128 MiB,
//     pipeline/flux_stage.h), which it reads instead of the blocks' AdaLayerNorm weights every step.
// The allocator's rounding (every allocation above 1 MiB is a multiple of 2 MiB) is counted per tensor in the
// stage's weights instead (allocator_weight_bytes). What it keeps between phases (the text encoders' cached
// segments, split by smaller tensors) is not planned for: the runtime returns the cache to the driver between
// phases instead.
int64_t allocator_reserve_bytes(const models::FluxConfig& config, io::DType dtype);
// A tensor's bytes as the CUDA caching allocator reserves them: 512-byte multiples up to 1 MiB, 2 MiB
// multiples above.
int64_t allocator_weight_bytes(int64_t tensor_bytes);

struct PipelinePlacement {
  DeviceMap device_map;  // cleaned, hf_device_map style
  int64_t workspace_bytes = 0;
  int64_t allocator_reserve_bytes = 0;  // held back from every GPU with cuda_caps, beyond workspace_bytes (see above)
  std::map<Device, int64_t> weights;
};

// The "pipeline" strategy over the GPUs of `max_memory` with a budget (in index order): a stage fits when its
// weights and the activation workspace fit the budget (with cuda_caps: its weights as the allocator reserves
// them, the activation workspace and allocator_reserve_bytes).
// Throws naming the budget when no contiguous split fits.
// cuda_caps: the runtime on CUDA, where max_memory caps each rank's allocator; the allocator's rounding and
// allocator_reserve_bytes are held back too (PlanRequest::cuda_caps; on CPU nothing caps the ranks).
PipelinePlacement plan_pipeline(const models::FluxConfig& config, const ModuleTree& tree, const MaxMemory& max_memory,
                                const TimingModel& timing, io::DType dtype, bool cuda_caps = false);

}  // namespace dp::placement
