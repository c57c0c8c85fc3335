#pragma once
// `diffpipe plan` as a library call: read a model folder's configs and safetensors headers (no weights),
// place the transformer with the requested strategy and, when asked, whole components with pipeline-level
// "balanced" (every component by default, as diffusers), and report hf_device_map, per-device bytes, ranks and predicted stage times next to those of
// "balanced" and "pipeline".
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "placement/device.h"
#include "placement/stage_timing.h"

namespace dp::placement {

// The largest world a plan covers. Far beyond any pipeline of FLUX's 57 blocks, and small enough that every
// per-GPU table and printed row stays instant.
constexpr int kMaxWorldSize = 4096;

struct PlanRequest {
  std::string model_dir;
  // auto | balanced | balanced_low_0 | sequential | pipeline | path of a JSON device map.
  std::string device_map = "auto";
  std::string pipeline_device_map;               // "" (none) or "balanced"
  std::vector<std::string> pipeline_components;  // empty: every component with weights, as diffusers
  std::optional<MaxMemory> max_memory;           // absent: every GPU of the world at gpu_memory_bytes, plus cpu
  // GPUs (ranks) in the world, 1 to kMaxWorldSize; absent: one past the highest GPU max_memory names (or 1).
  std::optional<int> world_size;
  io::DType dtype = io::DType::BF16;
  TimingModel timing;
  // Plan as the runtime does on CUDA, where --max-memory also caps each rank's allocator: accelerate's
  // strategies (auto, balanced, ...) fill a GPU with weights up to its max_memory, which leaves a capped rank no
  // room for activations or for streaming offloaded blocks. With this set, every GPU's budget for weights is its
  // max_memory less runtime_holdback_bytes() before the strategy places them (the cap stays max_memory), and
  // "pipeline" holds back the allocator reserve and rounding (plan_pipeline's cuda_caps).
  bool cuda_caps = false;
  // --fp8-gemms: the blocks' projections are sized as FP8 (flux_module_tree's BlockWeights::fp8_gemms), which
  // lets more blocks share a GPU, for plans that hold every block on a GPU. A plan that would offload blocks is
  // made at checkpoint sizes instead: offloaded blocks stay bf16 and stream at that size. Under cuda_caps each
  // GPU also keeps one block at the run dtype free, where a block is converted as it loads.
  bool fp8_gemms = false;
  int64_t gpu_memory_bytes = 141'000'000'000;  // assumed free memory per GPU when max_memory is absent (H200)
  int64_t cpu_memory_bytes = 128'000'000'000;
};

// Reads --max-memory: a JSON file path (an object of device -> size) or the inline "0=16GB,cpu=64GB" form.
MaxMemory read_max_memory_argument(const std::string& argument);

// What cuda_caps holds back from each GPU: the ring's activation workspace, the allocator reserve
// (stage_timing.h), and two of the largest blocks, the double buffer of a rank that streams offloaded blocks.
int64_t runtime_holdback_bytes(const models::FluxConfig& config, const std::vector<TimedUnit>& units,
                               const TimingModel& timing, io::DType dtype, int world);

// The transformer's config.json of a model folder (or of the transformer folder itself), without its headers:
// what checks made before any planning need (the attention heads for --sequence-parallel).
models::FluxConfig read_transformer_config(const std::string& model_dir);

// The whole plan as one JSON object; throws dp::Error naming the file, key or value at fault.
// With timing.sequence_parallel = K, the world is one of S stage groups (GPU d of a map = stage group d) and
// stage times are one rank's (stage_timing.h).
nlohmann::ordered_json make_plan(const PlanRequest& request);

}  // namespace dp::placement
