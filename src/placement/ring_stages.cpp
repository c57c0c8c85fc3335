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

const char* tier_name(OffloadTier tier) { return tier == OffloadTier::cpu ? "cpu" : "disk"; }

std::vector<RankStage> ring_stages(const nlohmann::ordered_json& hf_device_map, const models::FluxConfig& config,
                                   int world_size) {
  DP_CHECK(hf_device_map.is_object() && !hf_device_map.empty(), "the device map is empty or not an object");
  // First pass: each block's GPU (or -1 when offloaded) and its tier.
  std::vector<int> gpu_of(static_cast<size_t>(config.num_blocks()), -1);
  std::vector<OffloadTier> tier_of(static_cast<size_t>(config.num_blocks()), OffloadTier::cpu);
  const auto block_name = [&](int64_t b) {
    return b < config.num_layers ? "transformer_blocks." + std::to_string(b)
                                 : "single_transformer_blocks." + std::to_string(b - config.num_layers);
  };
  for (int64_t b = 0; b < config.num_blocks(); ++b) {
    const std::string name = block_name(b);
    const auto device = device_of(hf_device_map, name);
    if (device.is_string() && (device == "cpu" || device == "disk")) {
      tier_of[static_cast<size_t>(b)] = device == "cpu" ? OffloadTier::cpu : OffloadTier::disk;
      continue;
    }
    DP_CHECK(device.is_number_integer(), name, " is placed on ", device.dump(),
             ": a device is a GPU index, \"cpu\" or \"disk\"");
    const int rank = device.get<int>();
    DP_CHECK(rank >= 0 && rank < world_size, name, " is placed on GPU ", rank, " but the world has ", world_size,
             " rank(s) (GPU d of the device map is rank d)");
    gpu_of[static_cast<size_t>(b)] = rank;
  }
  // Second pass: an offloaded block runs on the rank whose range it continues (see the header).
  int first_gpu = -1;
  for (int g : gpu_of)
    if (g >= 0) {
      first_gpu = g;
      break;
    }
  DP_CHECK(first_gpu >= 0, "the device map offloads every transformer block to cpu or disk: the runtime runs "
           "offloaded blocks on the GPU rank whose range they continue, and no block is on a GPU; give the GPUs "
           "room for at least one block (a larger --max-memory, or a custom map)");
  std::vector<RankStage> stages;
  int previous_gpu = first_gpu;
  for (int64_t b = 0; b < config.num_blocks(); ++b) {
    const bool offloaded = gpu_of[static_cast<size_t>(b)] < 0;
    const int rank = offloaded ? previous_gpu : gpu_of[static_cast<size_t>(b)];
    previous_gpu = rank;
    if (stages.empty() || stages.back().rank != rank) {
      for (const auto& s : stages)
        DP_CHECK(s.rank != rank, "rank ", rank, " holds blocks [", s.first_block, ", ", s.last_block, ") and ",
                 block_name(b), ", which are not contiguous; the ring visits each rank once");
      stages.push_back({rank, b, b});
    }
    stages.back().last_block = b + 1;
    if (offloaded) stages.back().offloaded.push_back({b, tier_of[static_cast<size_t>(b)]});
  }
  return stages;
}

std::string describe_stage(const RankStage& stage) {
  std::string text = str("rank ", stage.rank, " blocks [", stage.first_block, ", ", stage.last_block, ")");
  if (stage.offloaded.empty()) return text;
  // Runs of consecutive blocks on the same tier: "16-17 cpu, 18 disk".
  std::string runs;
  for (size_t i = 0; i < stage.offloaded.size();) {
    size_t j = i;
    while (j + 1 < stage.offloaded.size() && stage.offloaded[j + 1].block == stage.offloaded[j].block + 1 &&
           stage.offloaded[j + 1].tier == stage.offloaded[i].tier)
      ++j;
    runs += str(runs.empty() ? "" : ", ", stage.offloaded[i].block,
                j > i ? str("-", stage.offloaded[j].block) : std::string(), " ", tier_name(stage.offloaded[i].tier));
    i = j + 1;
  }
  return str(text, ", ", stage.offloaded.size(), " offloaded (", runs, ")");
}

}  // namespace dp::placement
