#include "placement/plan.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/human_units.h"
#include "core/log.h"
#include "core/json_file.h"
#include "io/model_folder.h"
#include "io/run_dtype.h"
#include "io/weight_index.h"
#include "placement/auto_device_map.h"
#include "placement/component_placement.h"
#include "placement/custom_device_map.h"
#include "placement/flux_module_tree.h"

namespace fs = std::filesystem;

namespace dp::placement {

MaxMemory read_max_memory_argument(const std::string& argument) {
  if (argument.size() > 5 && argument.compare(argument.size() - 5, 5, ".json") == 0)
    return MaxMemory::from_json(read_json_file(argument, kMaxJsonFileBytes, DuplicateKeys::refuse), argument);
  return MaxMemory::parse(argument);
}

namespace {

nlohmann::ordered_json map_json(const DeviceMap& map) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [key, device] : map) out[key] = to_json_value(device);
  return out;
}

nlohmann::ordered_json timing_json(const std::string& strategy, const TimingReport& report) {
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const auto& s : report.stages) {
    stages.push_back({{"device", to_json_value(s.device)}, {"rank", s.device.index}, {"ms", s.ms},
                      {"weights_bytes", s.weight_bytes}, {"offloaded_bytes_run_here", s.offloaded_bytes},
                      {"first_unit", s.first_unit}, {"last_unit", s.last_unit}});
  }
  return {{"strategy", strategy}, {"stages", stages}, {"max_stage_ms", report.max_ms},
          {"mean_stage_ms", report.mean_ms}, {"sum_ms", report.total_ms}, {"imbalance", report.imbalance()},
          {"pipeline_efficiency", report.efficiency()}};
}

struct Transformer {
  io::Component component;
  models::FluxConfig config;
  ModuleTree tree{"FluxTransformer2DModel"};
};

const io::Component& transformer_component(const io::ModelFolder& folder) {
  const io::Component* found = nullptr;
  for (const auto& c : folder.components())
    if (c.class_name == "FluxTransformer2DModel") found = &c;
  DP_CHECK(found != nullptr, folder.dir(), ": no FluxTransformer2DModel component (model_index.json or config.json)");
  return *found;
}

Transformer load_transformer(const io::ModelFolder& folder, io::DType dtype, BlockWeights blocks) {
  const io::Component* found = &transformer_component(folder);
  DP_CHECK(found->has_weights, found->path, ": the transformer has no *.safetensors weights (headers are needed)");
  Transformer t{*found, {}, ModuleTree("FluxTransformer2DModel")};
  const std::string config_path = (fs::path(found->path) / "config.json").string();
  t.config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
  t.tree = flux_module_tree(t.config, io::WeightIndex::open_dir(found->path), dtype, blocks);
  return t;
}

}  // namespace

models::FluxConfig read_transformer_config(const std::string& model_dir) {
  DP_CHECK(!model_dir.empty(), "--model is required");
  const auto folder = io::ModelFolder::open(model_dir);
  const std::string config_path = (fs::path(transformer_component(folder).path) / "config.json").string();
  return models::FluxConfig::from_json(read_json_file(config_path), config_path);
}

int64_t runtime_holdback_bytes(const models::FluxConfig& config, const std::vector<TimedUnit>& units,
                               const TimingModel& timing, io::DType dtype, int world) {
  int64_t largest_block = 0;
  for (const auto& unit : units)
    if (unit.name.find("blocks.") != std::string::npos) largest_block = std::max(largest_block, unit.bytes);
  return activation_workspace_bytes(config, timing, dtype, world) + allocator_reserve_bytes(config, dtype) +
         2 * largest_block;
}

namespace {

int world_of(const PlanRequest& request) {
  if (!request.world_size) {
    int inferred = 1;
    if (request.max_memory) {
      const auto gpus = request.max_memory->gpu_indices();
      if (!gpus.empty()) inferred = gpus.back() + 1;
    }
    DP_CHECK(inferred <= kMaxWorldSize, "--max-memory names GPU ", inferred - 1, ", which makes a world of ", inferred,
             " GPUs; at most ", kMaxWorldSize, " are supported");
    return inferred;
  }
  const int world = *request.world_size;
  DP_CHECK(world >= 1 && world <= kMaxWorldSize, "--world-size must be positive and at most ", kMaxWorldSize, ", got ",
           world, " (leave it out to infer it from --max-memory)");
  if (request.max_memory) {
    for (int gpu : request.max_memory->gpu_indices())
      DP_CHECK(gpu < world, "--max-memory key '", gpu, "': GPU ", gpu, " is not in the world of ", world,
               " GPU(s) set by --world-size");
  }
  return world;
}

nlohmann::ordered_json devices_json(const MaxMemory& user, const MaxMemory& caps, const std::map<Device, int64_t>& weights,
                                    const std::map<Device, int64_t>& reserved, int world) {
  std::set<Device> devices;
  for (int g = 0; g < world; ++g) devices.insert(Device::gpu(g));
  for (const auto& [d, b] : user.entries()) devices.insert(d);
  for (const auto& [d, b] : weights) devices.insert(d);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Device& d : devices) {
    const int64_t w = weights.count(d) ? weights.at(d) : 0;
    const int64_t r = reserved.count(d) ? reserved.at(d) : 0;
    nlohmann::ordered_json entry = {{"device", to_json_value(d)},
                                    {"rank", d.is_gpu() ? nlohmann::ordered_json(d.index) : nlohmann::ordered_json(nullptr)},
                                    {"offloaded", d.offloaded()}, {"weights_bytes", w}, {"reserved_bytes", r}};
    if (d.kind == Device::Kind::disk) {
      entry["budget_bytes"] = nullptr;  // accelerate treats disk as unlimited
      entry["free_bytes"] = nullptr;
    } else {
      const int64_t budget = user.has(d) ? user.at(d) : 0;
      entry["budget_bytes"] = budget;
      if (caps.has(d) && caps.at(d) != budget) entry["balanced_cap_bytes"] = caps.at(d);
      entry["free_bytes"] = budget - w - r;
    }
    out.push_back(entry);
  }
  return out;
}

bool offloads(const DeviceMap& map) {
  return std::any_of(map.begin(), map.end(), [](const auto& entry) { return entry.second.offloaded(); });
}

nlohmann::ordered_json make_plan_sized(const PlanRequest& request, BlockWeights blocks);

}  // namespace

nlohmann::ordered_json make_plan(const PlanRequest& request) {
  if (!request.fp8_gemms) return make_plan_sized(request, BlockWeights::run_dtype);
  nlohmann::ordered_json plan = make_plan_sized(request, BlockWeights::fp8_gemms);
  if (!plan.contains("offloaded") || !plan["offloaded"].get<bool>()) {
    plan["block_weights"] = "fp8: the blocks' projections sized at one byte an element (--fp8-gemms)";
    return plan;
  }
  plan = make_plan_sized(request, BlockWeights::run_dtype);
  plan["block_weights"] = str(io::run_dtype_name(request.dtype), ": at FP8 sizes the plan offloads blocks, which "
                              "stay ", io::run_dtype_name(request.dtype), " and stream at that size (--fp8-gemms "
                              "converts only the blocks held on a GPU)");
  return plan;
}

namespace {

nlohmann::ordered_json make_plan_sized(const PlanRequest& request, BlockWeights blocks) {
  DP_CHECK(!request.model_dir.empty(), "--model is required");
  const auto folder = io::ModelFolder::open(request.model_dir);
  const int world = world_of(request);
  const bool user_set = request.max_memory.has_value();
  MaxMemory max_memory;
  if (user_set) {
    max_memory = *request.max_memory;
  } else {
    for (int g = 0; g < world; ++g) max_memory.set(Device::gpu(g), request.gpu_memory_bytes);
    max_memory.set(Device::cpu(), request.cpu_memory_bytes);
  }
  std::vector<int> world_gpus;
  for (int g = 0; g < world; ++g) world_gpus.push_back(g);

  nlohmann::ordered_json plan = {{"model", request.model_dir}, {"dtype", io::run_dtype_name(request.dtype)},
                                 {"world_size", world}, {"max_memory", max_memory.to_json()},
                                 {"max_memory_from", user_set ? "--max-memory" : "assumed free memory per GPU"}};
  const Transformer t = load_transformer(folder, request.dtype, blocks);
  const auto units = flux_timed_units(t.config, t.tree, request.timing);
  if (blocks == BlockWeights::fp8_gemms && request.cuda_caps) {
    // A block is read at the run dtype and converted in place of itself: keep one such block free on each GPU.
    const int64_t converting = flux_largest_block_bytes(t.config, flux_module_tree(t.config, request.dtype));
    max_memory = max_memory.less_on_gpus(converting);
    plan["fp8_converting_holdback_bytes"] = converting;
  }

  // The requested placement.
  Strategy strategy = Strategy::auto_;
  DeviceMap hf_map;
  std::map<Device, int64_t> weights, reserved;
  bool custom_map = false;
  MaxMemory caps = max_memory;
  nlohmann::ordered_json transformer = {{"component", t.component.name}, {"total_bytes", t.tree.total_bytes()},
                                        {"device_map", request.device_map}, {"config", t.config.to_json()}};
  if (parse_strategy(request.device_map, &strategy)) {
    MaxMemory weight_budgets = max_memory;
    if (request.cuda_caps) {
      const int64_t holdback = runtime_holdback_bytes(t.config, units, request.timing, request.dtype, world);
      weight_budgets = max_memory.less_on_gpus(holdback);
      transformer["runtime_holdback_bytes"] = holdback;
    }
    const auto placed = place_with_strategy(t.tree, strategy, weight_budgets, user_set);
    hf_map = placed.device_map;
    weights = placed.weights;
    reserved = placed.reserved;
    caps = placed.budgets;
  } else if (request.device_map == "pipeline") {
    const auto placed = plan_pipeline(t.config, t.tree, max_memory, request.timing, request.dtype, request.cuda_caps);
    hf_map = placed.device_map;
    weights = placed.weights;
    // Activation workspace and what the CUDA allocator needs beyond the weights (stage_timing.h says what).
    for (const auto& [d, w] : weights) reserved[d] = placed.workspace_bytes + placed.allocator_reserve_bytes;
    transformer["activation_workspace_bytes"] = placed.workspace_bytes;
    transformer["allocator_reserve_bytes"] = placed.allocator_reserve_bytes;
  } else {
    DP_CHECK(fs::is_regular_file(request.device_map), "--device-map '", request.device_map,
             "' is neither a strategy (auto, balanced, balanced_low_0, sequential, pipeline) nor a JSON file");
    // Parsed here rather than with read_json_file so that hf_device_map keeps the user's key order.
    std::ifstream in(request.device_map);
    nlohmann::ordered_json ordered;
    try {
      ordered = nlohmann::ordered_json::parse(in);
    } catch (const std::exception& e) {
      DP_FAIL(request.device_map, ": not valid JSON: ", e.what());
    }
    const auto placed = resolve_custom_device_map(t.tree, ordered, request.device_map, world);
    hf_map = placed.device_map;
    weights = placed.weights;
    custom_map = true;
  }
  transformer["hf_device_map"] = map_json(hf_map);
  plan["hf_device_map"] = map_json(hf_map);
  plan["offloaded"] = offloads(hf_map);
  plan["transformer"] = transformer;
  plan["devices"] = devices_json(max_memory, caps, weights, reserved, world);
  // A custom map is taken as written (as accelerate takes it): said aloud when it puts more on a device than
  // its budget, the cpu with no budget at all included, instead of planning it silently.
  nlohmann::ordered_json warnings = nlohmann::ordered_json::array();
  for (const auto& [device, bytes] : weights) {
    if (!custom_map || device.kind == Device::Kind::disk || bytes == 0) continue;
    const int64_t budget = max_memory.has(device) ? max_memory.at(device) : 0;
    if (bytes <= budget) continue;
    warnings.push_back(str(request.device_map, " puts ", human_size(static_cast<double>(bytes)), " on ",
                           to_json_value(device).dump(), ", whose budget is ", human_size(static_cast<double>(budget)),
                           max_memory.has(device) ? std::string(" (--max-memory)") : std::string(" (not in --max-memory)"),
                           ": the run may not fit; give the device a budget in --max-memory or move modules off it"));
    DP_WARN("plan: ", warnings.back().get<std::string>());
  }
  if (!warnings.empty()) plan["warnings"] = warnings;
  plan["stage_times"] = timing_json(request.device_map, time_placement(units, t.tree, resolve_tensor_devices(t.tree, hf_map, "hf_device_map"),
                                                                         world_gpus, request.timing));

  // The comparison the issue asks for: "balanced" (memory-balanced) against "pipeline" (time-balanced).
  nlohmann::ordered_json comparison = nlohmann::ordered_json::object();
  const auto balanced = place_with_strategy(t.tree, Strategy::balanced, max_memory, user_set);
  comparison["balanced"] = timing_json("balanced", time_placement(units, t.tree,
      resolve_tensor_devices(t.tree, balanced.device_map, "balanced"), world_gpus, request.timing));
  comparison["balanced"]["hf_device_map"] = map_json(balanced.device_map);
  try {
    const auto pipelined = plan_pipeline(t.config, t.tree, max_memory, request.timing, request.dtype, request.cuda_caps);
    comparison["pipeline"] = timing_json("pipeline", time_placement(units, t.tree,
        resolve_tensor_devices(t.tree, pipelined.device_map, "pipeline"), world_gpus, request.timing));
    comparison["pipeline"]["hf_device_map"] = map_json(pipelined.device_map);
  } catch (const Error& e) {
    comparison["pipeline"] = {{"strategy", "pipeline"}, {"infeasible", e.what()}};
  }
  comparison["timing_source"] = request.timing.calibrated ? "calibrated " + request.timing.calibration_source
                                : request.timing.measured() ? std::string("FLOP-scaled: measured block times scaled by FLOPs")
                                                            : std::string("FLOP-scaled: FLOPs at the sustained TFLOP/s");
  comparison["calibrated"] = request.timing.calibrated.has_value();
  comparison["resolution"] = std::to_string(request.timing.height) + "x" + std::to_string(request.timing.width);
  plan["comparison"] = comparison;

  if (!request.pipeline_device_map.empty()) {
    DP_CHECK(request.pipeline_device_map == "balanced", "--pipeline-device-map '", request.pipeline_device_map,
             "': diffusers supports only \"balanced\" at the pipeline level");
    std::vector<std::string> names = request.pipeline_components;
    if (names.empty()) {
      // FluxPipeline.from_pretrained(device_map="balanced") places every model of the folder, the
      // transformer and the VAE included; tokenizers and the scheduler have no weights.
      for (const auto& c : folder.components())
        if (c.has_weights) names.push_back(c.name);
    }
    std::vector<ComponentSize> sizes;
    for (const auto& name : names) {
      const auto& c = folder.component(name);
      DP_CHECK(c.has_weights, request.model_dir, ": component '", name, "' has no weights to place");
      sizes.push_back({name, component_bytes(c, folder.config(name), request.dtype)});
    }
    const auto placed = place_components_balanced(sizes, max_memory);
    plan["pipeline_hf_device_map"] = map_json(placed.device_map);
    nlohmann::ordered_json components = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < placed.sizes.size(); ++i)
      components.push_back({{"component", placed.sizes[i].name}, {"bytes", placed.sizes[i].bytes},
                            {"device", to_json_value(placed.device_map[i].second)},
                            {"offloaded", placed.device_map[i].second.offloaded()}});
    plan["components"] = components;
  }
  return plan;
}

}  // namespace

}  // namespace dp::placement
