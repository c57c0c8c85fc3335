#include "runtime/components.h"

#include "core/error.h"
#include "core/human_units.h"
#include "core/json_file.h"
#include "models/clip/clip_text_model.h"
#include "models/t5/t5_encoder.h"
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

EncoderWarmUp plan_encoder_warm_up(const ComponentPlan& plan, const io::ModelFolder& folder,
                                   const std::string& max_memory, at::ScalarType dtype, int rank, int gpu,
                                   int64_t rows, int64_t seq) {
  EncoderWarmUp warm;
  warm.clip = plan.clip.rank == rank && !plan.clip.on_cpu;
  warm.t5 = plan.t5.rank == rank && !plan.t5.on_cpu;
  if ((!warm.clip && !warm.t5) || max_memory.empty()) return warm;
  const auto caps = placement::read_max_memory_argument(max_memory);
  const auto device = placement::Device::gpu(gpu);
  if (!caps.has(device)) return warm;
  const io::DType run_dtype = io::to_safetensors_dtype(dtype);
  // The placement's count of the weights where it made one (with a map), else the same count made here.
  const auto weights_of = [&](const ComponentPlace& place) {
    return place.bytes > 0 ? place.bytes
                           : placement::component_bytes(folder.component(place.name), folder.config(place.name),
                                                        run_dtype);
  };
  const auto config_of = [&](const ComponentPlace& place) {
    const std::string path = folder.component(place.name).path + "/config.json";
    return std::make_pair(read_json_file(path), path);
  };
  int64_t weights = 0, warm_up = 0;
  if (warm.clip) {
    const auto [json, path] = config_of(plan.clip);
    weights += weights_of(plan.clip);
    warm_up = std::max(warm_up, models::ClipTextModel::warm_up_bytes(models::ClipTextConfig::from_json(json, path),
                                                                     dtype, rows));
  }
  if (warm.t5) {
    const auto [json, path] = config_of(plan.t5);
    weights += weights_of(plan.t5);
    warm_up = std::max(warm_up, models::T5Encoder::warm_up_bytes(models::T5Config::from_json(json, path), dtype,
                                                                 rows, seq));
  }
  const int64_t cap = caps.at(device);
  const bool fits = weights + warm_up <= cap;
  const auto size = [](int64_t bytes) { return human_size(static_cast<double>(bytes)); };
  warm.reason = str(fits ? "on" : "off", ": the text encoders' weights (", size(weights), ") and the warm-up (",
                    size(warm_up), " at most) ", fits ? "fit" : "do not fit", " the --max-memory cap of GPU ", gpu,
                    " (", size(cap), ")");
  if (!fits) warm.clip = warm.t5 = false;
  return warm;
}

}  // namespace dp::runtime
