#include "placement/ring_stages.h"

#include <map>
#include <string>

#include "core/error.h"

namespace dp::placement {
namespace {

// The device the map gives module `name`: the entry whose key is `name` or one of its ancestors ("" is the
// root). Throws when an entry sits below `name` (the block would be split).
nlohmann::ordered_json device_of(const nlohmann::ordered_json& map, const std::string& name) {
  const nlohmann::ordered_json* found = nullptr;
  size_t found_length = 0;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string& key = it.key();
    const bool ancestor = key.empty() || key == name || (name.rfind(key + ".", 0) == 0);
    if (ancestor && (found == nullptr || key.size() >= found_length)) {
      found = &it.value();
      found_length = key.size();
    }
    DP_CHECK(key.rfind(name + ".", 0) != 0, "device map entry '", key, "' splits ", name,
             " across devices; the runtime places whole blocks");
  }
  DP_CHECK(found != nullptr, "the device map places no entry for ", name);
  return *found;
}

}  // namespace

std::vector<RankStage> ring_stages(const nlohmann::ordered_json& hf_device_map, const models::FluxConfig& config,
                                   int world_size) {
  DP_CHECK(hf_device_map.is_object() && !hf_device_map.empty(), "the device map is empty or not an object");
  std::vector<RankStage> stages;
  for (int64_t b = 0; b < config.num_blocks(); ++b) {
    const std::string name = b < config.num_layers
                                 ? "transformer_blocks." + std::to_string(b)
                                 : "single_transformer_blocks." + std::to_string(b - config.num_layers);
    const auto device = device_of(hf_device_map, name);
    DP_CHECK(device.is_number_integer(), name, " is placed on ", device.dump(),
             ": blocks offloaded to cpu or disk are not run by the multi-rank runtime yet; give every block a GPU "
             "(a larger --max-memory, or more ranks)");
    const int rank = device.get<int>();
    DP_CHECK(rank >= 0 && rank < world_size, name, " is placed on GPU ", rank, " but the world has ", world_size,
             " rank(s) (GPU d of the device map is rank d)");
    if (!stages.empty() && stages.back().rank == rank) {
      stages.back().last_block = b + 1;
      continue;
    }
    for (const auto& s : stages)
      DP_CHECK(s.rank != rank, "rank ", rank, " holds blocks [", s.first_block, ", ", s.last_block, ") and ", name,
               ", which are not contiguous; the ring visits each rank once");
    stages.push_back({rank, b, b + 1});
  }
  return stages;
}

}  // namespace dp::placement
