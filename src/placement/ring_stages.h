#pragma once
// From a transformer device map to the ring a multi-rank run uses: GPU d of the map is rank d, and each rank
// runs the contiguous range of blocks the map gives it. Blocks are numbered as FluxTransformer numbers them:
// double blocks [0, num_layers), then single blocks.
//
// Offloaded blocks (the map says "cpu" or "disk", as accelerate's "auto" does once the GPUs are full) still
// run; they are never dropped. accelerate executes an offloaded module on the main device, streaming its
// weights in per use. The ring's rule, so that it stays a ring (each rank visited once, in block order):
//   an offloaded block runs on the GPU rank whose range it continues, i.e. the rank of the nearest block
//   before it that the map puts on a GPU; offloaded blocks before the first GPU block run on the rank of the
//   first GPU block after them.
// "auto" fills GPU 0, then GPU 1, ..., then cpu, then disk, so its offloaded blocks are the last ones and run
// on the last GPU rank. That rank keeps their weights in host memory ("cpu", pinned on CUDA) or in the mmapped
// safetensors file ("disk") and copies them to its GPU per use. A map that puts no block at all on a GPU is
// refused: there is no GPU range for the offloaded blocks to continue.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/flux/flux_config.h"

namespace dp::placement {

enum class OffloadTier { cpu, disk };

struct OffloadedBlock {
  int64_t block = 0;
  OffloadTier tier = OffloadTier::cpu;
  bool operator==(const OffloadedBlock& other) const { return block == other.block && tier == other.tier; }
};

struct RankStage {
  int rank = 0;
  int64_t first_block = 0;
  int64_t last_block = 0;  // exclusive
  // Blocks of [first_block, last_block) the map offloads, in block order; this rank runs them from host memory.
  std::vector<OffloadedBlock> offloaded = {};
};

const char* tier_name(OffloadTier tier);

// hf_device_map: module path -> GPU index, "cpu" or "disk" (as `plan` prints it). Returns the stages in block
// order; ranks of the world that get no block are left out. Offloaded blocks join a rank by the rule above.
// Throws, naming the module or rank, when a rank's blocks are not contiguous, when the ring would visit a rank
// twice, when a block is split across devices, when a GPU index is outside the world, or when no block is on a
// GPU.
std::vector<RankStage> ring_stages(const nlohmann::ordered_json& hf_device_map, const models::FluxConfig& config,
                                   int world_size);

// "rank 1 blocks [10, 19), 3 offloaded (16-17 cpu, 18 disk)": one stage as logs and `plan` show it.
std::string describe_stage(const RankStage& stage);

}  // namespace dp::placement
