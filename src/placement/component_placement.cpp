#include "placement/component_placement.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/json_file.h"
#include "io/weight_index.h"
#include "placement/flux_module_tree.h"

namespace dp::placement {

int64_t component_bytes(const io::Component& component, const nlohmann::json& config, io::DType run_dtype) {
  const auto weights = io::WeightIndex::open_dir(component.path);
  int64_t total = 0;
  for (const auto& name : weights.names()) {
    const auto& info = weights.info(name);
    total += bytes_at_run_dtype(info.dtype, info.numel(), run_dtype);
  }
  if (component.class_name == "T5EncoderModel" && weights.contains("shared.weight") &&
      !weights.contains("encoder.embed_tokens.weight")) {
    // diffusers sizes each component built empty (accelerate.init_empty_weights), and there the encoder's
    // embedding is a second table rather than shared.weight: FluxPipeline.from_pretrained(device_map=
    // "balanced") counts it twice, so the map follows only if we do too.
    const auto& shared = weights.info("shared.weight");
    total += bytes_at_run_dtype(shared.dtype, shared.numel(), run_dtype);
  }
  if (component.class_name == "CLIPTextModel" || component.class_name == "CLIPTextModelWithProjection") {
    // embeddings.position_ids: int64 [1, max_position_embeddings], registered with persistent=False.
    const int64_t positions = json_get_or<int64_t>(config, "max_position_embeddings", 77, component.path + "/config.json");
    total += 8 * positions;
  }
  return total;
}

ComponentPlacement place_components_balanced(std::vector<ComponentSize> components, const MaxMemory& max_memory) {
  ComponentPlacement out;
  std::stable_sort(components.begin(), components.end(),
                   [](const ComponentSize& a, const ComponentSize& b) { return a.bytes > b.bytes; });
  out.sizes = components;

  // Budgets largest first (ties keep accelerate's device order); "cpu" is the fallback, not a turn.
  std::vector<std::pair<Device, int64_t>> devices;
  for (const auto& entry : max_memory.entries())
    if (entry.first.kind != Device::Kind::cpu) devices.push_back(entry);
  std::stable_sort(devices.begin(), devices.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::size_t> cycle;
  for (std::size_t i = 0; i < devices.size(); ++i) cycle.push_back(i);
  for (std::size_t i = devices.size(); i-- > 0;) cycle.push_back(i);

  std::size_t turn = 0;
  for (const auto& component : components) {
    if (cycle.empty()) {
      out.device_map.emplace_back(component.name, Device::cpu());
      continue;
    }
    auto& [device, left] = devices[cycle[turn % cycle.size()]];
    if (component.bytes > left) {
      out.device_map.emplace_back(component.name, Device::cpu());  // no advance: the next one tries this GPU
      continue;
    }
    out.device_map.emplace_back(component.name, device);
    left -= component.bytes;
    ++turn;
  }
  return out;
}

}  // namespace dp::placement
