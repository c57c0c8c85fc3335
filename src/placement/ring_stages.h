#pragma once
// From a transformer device map to the ring a multi-rank run uses: GPU d of the map is rank d, and each rank
// runs the contiguous range of blocks the map gives it. Blocks are numbered as FluxTransformer numbers them:
// double blocks [0, num_layers), then single blocks.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "models/flux/flux_config.h"

namespace dp::placement {

struct RankStage {
  int rank = 0;
  int64_t first_block = 0;
  int64_t last_block = 0;  // exclusive
};

// hf_device_map: module path -> GPU index, "cpu" or "disk" (as `plan` prints it). Returns the stages in block
// order; ranks of the world that get no block are left out. Throws, naming the module or rank, when a
// rank's blocks are not contiguous, when the ring would visit a rank twice, when a block is split across
// devices, when a GPU index is outside the world, or when blocks are offloaded to cpu/disk (not yet run by
// the multi-rank runtime).
std::vector<RankStage> ring_stages(const nlohmann::ordered_json& hf_device_map, const models::FluxConfig& config,
                                   int world_size);

}  // namespace dp::placement
