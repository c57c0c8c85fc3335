#pragma once
// accelerate's model-level placement, reproduced on a ModuleTree: get_balanced_memory (per-GPU caps for
// "auto"/"balanced"/"balanced_low_0"), infer_auto_device_map (the walk with a reserved largest layer on the
// main devices) and clean_device_map (merging sibling keys that share a device), with diffusers' arguments:
// the model's no-split classes and sizes at the run dtype.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "placement/device.h"
#include "placement/module_tree.h"

namespace dp::placement {

// Module path -> device, in the order accelerate inserts keys (walk order; merged keys where they merge).
using DeviceMap = std::vector<std::pair<std::string, Device>>;

enum class Strategy { auto_, balanced, balanced_low_0, sequential };
// "auto", "balanced", "balanced_low_0", "sequential"; false for anything else.
bool parse_strategy(const std::string& name, Strategy* out);
std::string strategy_name(Strategy strategy);

// get_balanced_memory. `user_set_max_memory` is false when the budgets are the machine's free memory (then a
// single GPU keeps 10% back, as accelerate does).
MaxMemory balanced_memory(const ModuleTree& tree, const MaxMemory& max_memory, bool low_zero,
                          bool user_set_max_memory = true);

struct AutoPlacement {
  DeviceMap device_map;              // cleaned, as hf_device_map
  MaxMemory budgets;                 // what the walk was given (after balancing)
  std::map<Device, int64_t> weights;   // bytes placed on each device
  std::map<Device, int64_t> reserved;  // room kept on main devices for an offloaded layer
};

// infer_auto_device_map over the given budgets (devices absent from them get nothing; "disk" is unlimited).
AutoPlacement infer_auto_device_map(const ModuleTree& tree, const MaxMemory& budgets);

// A strategy from end to end, as diffusers' _determine_device_map runs it.
AutoPlacement place_with_strategy(const ModuleTree& tree, Strategy strategy, const MaxMemory& max_memory,
                                  bool user_set_max_memory = true);

// clean_device_map: a module whose keys all share one device becomes one key (appended, as accelerate does);
// a map on a single device collapses to {"": device}.
DeviceMap clean_device_map(DeviceMap map);

}  // namespace dp::placement
