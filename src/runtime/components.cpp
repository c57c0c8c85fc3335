#include "runtime/components.h"

#include "core/error.h"
#include "io/torch_tensors.h"
#include "placement/component_placement.h"
#include "placement/plan.h"

namespace dp::runtime {
namespace {

nlohmann::ordered_json place_json(const ComponentPlace& place) {
  return place.on_cpu ? nlohmann::ordered_json("cpu") : nlohmann::ordered_json(place.rank);
}

}  // namespace

nlohmann::ordered_json ComponentPlan::encode_map() const {
  return {{clip.name, place_json(clip)}, {t5.name, place_json(t5)}};
}

nlohmann::ordered_json ComponentPlan::decode_map() const { return {{vae.name, place_json(vae)}}; }

ComponentPlan plan_components(const io::ModelFolder& folder, const std::string& pipeline_device_map,
                              const std::string& max_memory_argument, at::ScalarType dtype, int world_size,
                              int sequence_parallel) {
  ComponentPlan plan;
  if (pipeline_device_map.empty()) return plan;  // the coordinator runs all three
  DP_CHECK(pipeline_device_map == "balanced", "--pipeline-device-map '", pipeline_device_map,
           "': diffusers supports only \"balanced\" at the pipeline level");
  plan.from_map = true;
  DP_CHECK(sequence_parallel >= 1 && world_size % sequence_parallel == 0, "--sequence-parallel ", sequence_parallel,
           " does not divide the world of ", world_size);
  const int groups = world_size / sequence_parallel;
  placement::MaxMemory max_memory;
  if (max_memory_argument.empty()) {
    // As `plan` assumes without --max-memory: every GPU of the world at its default budget, plus the CPU.
    const placement::PlanRequest defaults;
    for (int g = 0; g < groups; ++g) max_memory.set(placement::Device::gpu(g), defaults.gpu_memory_bytes);
    max_memory.set(placement::Device::cpu(), defaults.cpu_memory_bytes);
  } else {
    max_memory = placement::read_max_memory_argument(max_memory_argument);
  }
  const io::DType run_dtype = io::to_safetensors_dtype(dtype);
  std::vector<placement::ComponentSize> sizes;
  for (ComponentPlace* place : {&plan.clip, &plan.t5, &plan.vae}) {
    DP_CHECK(folder.has(place->name), folder.dir(), ": --pipeline-device-map needs the component '", place->name, "'");
    place->bytes = placement::component_bytes(folder.component(place->name), folder.config(place->name), run_dtype);
    sizes.push_back({place->name, place->bytes});
  }
  const auto placed = placement::place_components_balanced(sizes, max_memory);
  for (const auto& [name, device] : placed.device_map) {
    ComponentPlace* place = name == plan.clip.name ? &plan.clip : name == plan.t5.name ? &plan.t5 : &plan.vae;
    DP_CHECK(device.kind != placement::Device::Kind::disk, "--pipeline-device-map balanced puts ", name,
             " on disk; a whole component cannot run from disk");
    if (device.kind == placement::Device::Kind::cpu) {
      place->rank = 0;
      place->on_cpu = true;
      continue;
    }
    if (sequence_parallel == 1)
      DP_CHECK(device.index < world_size, "--pipeline-device-map balanced puts ", name, " (",
               place->bytes / 1e6, " MB) on GPU ", device.index, ", but the world has ", world_size,
               " rank(s) (GPU d of the map is rank d): start ", device.index + 1,
               " or more ranks, or leave GPU ", device.index, " out of --max-memory");
    else
      DP_CHECK(device.index < groups, "--pipeline-device-map balanced puts ", name, " (", place->bytes / 1e6,
               " MB) on GPU ", device.index, ", but the world of ", world_size, " rank(s) has ", groups,
               " stage group(s) of --sequence-parallel ", sequence_parallel, " (GPU d of the map is stage group d): "
               "start more ranks, or leave GPU ", device.index, " out of --max-memory");
    place->rank = device.index * sequence_parallel;
  }
  return plan;
}

}  // namespace dp::runtime
