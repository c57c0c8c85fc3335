#pragma once
// A user's own device map ({"single_transformer_blocks.10": 1, ...}), checked against the module tree:
// each tensor goes to its most specific (longest) matching key. Unlike accelerate, which only warns, a key
// that names no module is an error, as is a tensor no key covers and a GPU outside the world.
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "placement/auto_device_map.h"
#include "placement/module_tree.h"

namespace dp::placement {

struct CustomPlacement {
  DeviceMap device_map;                          // the user's keys, in the user's order (diffusers keeps it so)
  std::map<std::string, Device> tensor_devices;  // every tensor, resolved
  std::map<Device, int64_t> weights;
};

// `doc` is the JSON object from `source` (a file name, for messages); `world_size` is the number of GPUs.
CustomPlacement resolve_custom_device_map(const ModuleTree& tree, const nlohmann::ordered_json& doc,
                                          const std::string& source, int world_size);

// Every tensor's device under `map` (most specific key wins); throws naming the first uncovered tensors.
std::map<std::string, Device> resolve_tensor_devices(const ModuleTree& tree, const DeviceMap& map,
                                                     const std::string& source);

}  // namespace dp::placement
