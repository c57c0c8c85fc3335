#include "placement/custom_device_map.h"

#include "core/error.h"

namespace dp::placement {
namespace {

// The longest key equal to `tensor` or a dotted prefix of it ("" covers everything).
const std::pair<std::string, Device>* most_specific(const DeviceMap& map, const std::string& tensor) {
  const std::pair<std::string, Device>* best = nullptr;
  for (const auto& entry : map) {
    const std::string& key = entry.first;
    const bool covers = key.empty() || tensor == key ||
                        (tensor.size() > key.size() && tensor.compare(0, key.size(), key) == 0 && tensor[key.size()] == '.');
    if (covers && (best == nullptr || key.size() > best->first.size())) best = &entry;
  }
  return best;
}

}  // namespace

CustomPlacement resolve_custom_device_map(const ModuleTree& tree, const nlohmann::ordered_json& doc,
                                          const std::string& source, int world_size) {
  DP_CHECK(doc.is_object() && !doc.empty(), source,
           ": a device map must be a non-empty JSON object of module path -> device, such as "
           "{\"transformer_blocks\": 0, \"single_transformer_blocks\": 1}");
  CustomPlacement out;
  for (const auto& item : doc.items()) {
    const std::string& key = item.key();
    const std::string context = source + ": key '" + key + "'";
    DP_CHECK(key.empty() || tree.find_module(key).has_value() || tree.has_tensor(key), context,
             " names no module or tensor of the transformer (keys are dotted paths such as "
             "'transformer_blocks.3' or 'single_transformer_blocks', as in hf_device_map)");
    const Device device = parse_device_value(item.value(), context);
    DP_CHECK(!device.is_gpu() || device.index < world_size, context, ": device ", device.index,
             " is not in the world of ", world_size, " GPU", world_size == 1 ? "" : "s",
             " (GPUs 0..", world_size - 1, "; set --world-size or --max-memory to add GPUs)");
    out.device_map.emplace_back(key, device);
  }
  out.tensor_devices = resolve_tensor_devices(tree, out.device_map, source);
  for (const auto& [tensor, device] : out.tensor_devices) out.weights[device] += tree.tensor_bytes(tensor);
  return out;
}

std::map<std::string, Device> resolve_tensor_devices(const ModuleTree& tree, const DeviceMap& map,
                                                     const std::string& source) {
  std::map<std::string, Device> out;
  std::string uncovered;
  int missing = 0;
  for (const auto& tensor : tree.tensors_in_order()) {
    const auto* entry = most_specific(map, tensor);
    if (entry == nullptr) {
      if (missing++ < 5) uncovered += (uncovered.empty() ? "" : ", ") + tensor;
      continue;
    }
    out[tensor] = entry->second;
  }
  DP_CHECK(missing == 0, source, ": ", missing, " tensor", missing == 1 ? "" : "s",
           " covered by no key of the device map, first: ", uncovered, (missing > 5 ? ", ..." : ""),
           "; add a key for the module (or \"\" for everything else)");
  return out;
}

}  // namespace dp::placement
