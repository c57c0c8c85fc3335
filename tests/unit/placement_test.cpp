// Device maps against the oracle (tests/reference/cases_placement.py): for FLUX.1-dev at full size and for
// tiny configs, every strategy and max_memory setting gives exactly accelerate's hf_device_map, the module
// tree matches diffusers' named_modules, pipeline-level "balanced" matches diffusers, by default over every
// component as FluxPipeline.from_pretrained(device_map="balanced") on the full FLUX.1-dev folder, and the
// time-balanced "pipeline" strategy beats "balanced" on stage-time imbalance.
// Where accelerate or diffusers gives no answer to compare with (accelerate raises on a "disk" budget;
// diffusers' map drops components that missed their GPU), the expectation is ours: those cases live in the
// PlacementOursNotOracle suite, apart from the oracle's.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/json_file.h"
#include "io/model_folder.h"
#include "io/run_dtype.h"
#include "io/safetensors_writer.h"
#include "io/weight_index.h"
#include "models/flux/flux_config.h"
#include "placement/auto_device_map.h"
#include "placement/component_placement.h"
#include "placement/custom_device_map.h"
#include "placement/flux_module_tree.h"
#include "placement/plan.h"
#include "placement/stage_timing.h"
#include "test_support.h"

namespace fs = std::filesystem;

namespace dp::placement {
namespace {

std::string oracle_dir() { return dp::test::reference_dir() + "/placement"; }

nlohmann::json oracle_json(const std::string& name) {
  const std::string path = oracle_dir() + "/" + name;
  EXPECT_TRUE(fs::exists(path)) << "oracle output missing: " << path;
  return read_json_file(path);
}

// A model folder holding only a transformer: config.json and a header-only (sparse) checkpoint.
std::string header_only_model(const nlohmann::json& config, const std::string& tag) {
  static std::map<std::string, std::string> made;  // one folder per config for the whole run
  const std::string key = config.dump();
  if (made.count(key)) return made[key];
  const std::string dir = dp::test::temp_dir("placement-" + tag);
  fs::create_directories(dir + "/transformer");
  dp::test::write_file(dir + "/model_index.json",
                       R"({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]})");
  dp::test::write_file(dir + "/transformer/config.json", config.dump(2));
  io::SafetensorsWriter writer;
  for (const auto& p : models::flux_parameter_shapes(models::FluxConfig::from_json(config, tag)))
    writer.add(p.name, io::DType::BF16, p.shape);
  writer.write(dir + "/transformer/diffusion_pytorch_model.safetensors", [](std::size_t, void*, uint64_t) {}, true);
  made[key] = dir;
  return dir;
}

std::set<std::pair<std::string, std::string>> as_pairs(const DeviceMap& map) {
  std::set<std::pair<std::string, std::string>> out;
  for (const auto& [key, device] : map) out.emplace(key, to_string(device));
  return out;
}

std::set<std::pair<std::string, std::string>> as_pairs(const nlohmann::json& map) {
  std::set<std::pair<std::string, std::string>> out;
  if (map.is_array()) {
    for (const auto& kv : map) out.emplace(kv[0].get<std::string>(), to_string(parse_device_value(kv[1], "oracle")));
  } else {
    for (const auto& item : map.items()) out.emplace(item.key(), to_string(parse_device_value(item.value(), "oracle")));
  }
  return out;
}

std::string describe(const std::set<std::pair<std::string, std::string>>& pairs) {
  std::string out;
  for (const auto& [k, v] : pairs) out += k + ":" + v + " ";
  return out;
}

// "0=16GB,1=16GB" from an oracle case's max_memory object.
std::string max_memory_flag(const nlohmann::json& max_memory) {
  std::string spec;
  for (const auto& item : max_memory.items())
    spec += (spec.empty() ? "" : ",") + item.key() + "=" +
            (item.value().is_string() ? item.value().get<std::string>() : std::to_string(item.value().get<int64_t>()));
  return spec;
}

// The components of a case that diffusers' map leaves out: its overwrite bug keeps only the last of the
// components that missed their GPU (on cpu), so the others have no entry at all.
std::vector<std::string> dropped_by_diffusers(const nlohmann::json& diffusers_map, const nlohmann::json& components) {
  std::vector<std::string> dropped;
  for (const auto& name : components)
    if (!diffusers_map.contains(name.get<std::string>())) dropped.push_back(name.get<std::string>());
  return dropped;
}

// OUR expectation, not diffusers': its map with every dropped component put on cpu, where the last one that
// missed its GPU went.
std::set<std::pair<std::string, std::string>> our_fix_of_dropped(const nlohmann::json& diffusers_map,
                                                                 const std::vector<std::string>& dropped) {
  auto want = as_pairs(diffusers_map);
  for (const auto& name : dropped) want.emplace(name, "cpu");
  return want;
}


TEST(PlacementOracle, ModuleTreeAndParameterOrderMatchDiffusers) {
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(oracle_dir() + "/configs")) {
    const std::string name = entry.path().stem().string();
    SCOPED_TRACE(name);
    const auto config = models::FluxConfig::from_json(read_json_file(entry.path().string()), name);
    const auto listing = oracle_json("modules/" + name + ".json");
    const ModuleTree tree = flux_module_tree(config, io::DType::BF16);

    const auto order = tree.modules_in_order();
    ASSERT_EQ(order.size(), listing["modules"].size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto& node = tree.node(order[i]);
      const auto& expected = listing["modules"][i];
      ASSERT_EQ(node.path, expected[0].get<std::string>()) << "module " << i;
      EXPECT_EQ(node.class_name, expected[1].get<std::string>()) << node.path;
      std::vector<std::string> own;
      for (const auto& t : node.own_tensors) own.push_back(t.substr(t.rfind('.') + 1));
      EXPECT_EQ(own, expected[2].get<std::vector<std::string>>()) << node.path;
    }
    // flux_parameter_shapes (src/models) must list diffusers' named_parameters in order with their shapes.
    const auto shapes = models::flux_parameter_shapes(config);
    ASSERT_EQ(shapes.size(), listing["parameters"].size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      ASSERT_EQ(shapes[i].name, listing["parameters"][i][0].get<std::string>()) << "parameter " << i;
      EXPECT_EQ(shapes[i].shape, listing["parameters"][i][1].get<std::vector<int64_t>>()) << shapes[i].name;
    }
    EXPECT_TRUE(listing["buffers"].empty()) << "FLUX registers no buffers; sizes would need them";
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(PlacementOracle, ModelLevelMapsMatchAccelerate) {
  const auto cases = oracle_json("cases.json");
  ASSERT_GT(cases.size(), 100u);
  std::map<std::string, int> per_config;
  for (const auto& c : cases) {
    const std::string config_name = c["config"].get<std::string>();
    const std::string label = config_name + " " + c["dtype"].get<std::string>() + " " +
                              c["strategy"].get<std::string>() + " " + c["max_memory"].dump();
    SCOPED_TRACE(label);
    const auto config_json = read_json_file(oracle_dir() + "/configs/" + config_name + ".json");
    const std::string model = header_only_model(config_json, config_name);
    const auto config = models::FluxConfig::from_json(config_json, config_name);
    const io::DType dtype = io::parse_run_dtype(c["dtype"].get<std::string>());
    const ModuleTree tree = flux_module_tree(config, io::WeightIndex::open_dir(model + "/transformer"), dtype);
    ASSERT_EQ(tree.total_bytes(), c["total_bytes"].get<int64_t>());
    Strategy strategy;
    ASSERT_TRUE(parse_strategy(c["strategy"].get<std::string>(), &strategy));
    const auto placed = place_with_strategy(tree, strategy, MaxMemory::from_json(c["max_memory"], "case"));
    const auto got = as_pairs(placed.device_map);
    const auto want = as_pairs(c["expected"]);
    EXPECT_EQ(got, want) << "\n got: " << describe(got) << "\nwant: " << describe(want);
    per_config[config_name] += 1;
  }
  for (const auto& [name, count] : per_config) std::printf("[placement] %s: %d cases match accelerate\n", name.c_str(), count);
}

TEST(PlacementOracle, CliJsonGivesAcceleratesMapForFluxDev) {
  const auto cases = oracle_json("cases.json");
  int run = 0;
  for (const auto& c : cases) {
    if (c["config"] != "flux_dev" || c["dtype"] != "bfloat16") continue;
    std::string spec;
    for (const auto& item : c["max_memory"].items())
      spec += (spec.empty() ? "" : ",") + item.key() + "=" +
              (item.value().is_string() ? item.value().get<std::string>() : std::to_string(item.value().get<int64_t>()));
    const std::string model = header_only_model(read_json_file(oracle_dir() + "/configs/flux_dev.json"), "flux_dev");
    const std::string command = dp::test::diffpipe_binary() + " plan --json --model " + model + " --device-map " +
                                c["strategy"].get<std::string>() + " --max-memory " + spec;
    SCOPED_TRACE(command);
    const auto result = dp::test::run_command(command + " 2>/dev/null");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto plan = nlohmann::json::parse(result.output);
    EXPECT_EQ(as_pairs(plan["hf_device_map"]), as_pairs(c["expected"]));
    ++run;
  }
  EXPECT_GE(run, 30);
}

// Pipeline-level "balanced" on the oracle's tiny folder, library and CLI: `oracle` selects the cases where
// diffusers' map names every component (compared exactly), or else those where it drops some, compared with
// our fix of its bug. Returns how many cases ran, and how many of them placed every component by default.
std::pair<int, int> check_tiny_pipeline_cases(bool oracle) {
  const auto oracle_doc = oracle_json("pipeline_cases.json");
  const std::string model = oracle_dir() + "/pipeline_tiny";
  const auto folder = io::ModelFolder::open(model);
  std::map<std::string, int64_t> sizes;
  for (const auto& item : oracle_doc["sizes"].items()) {
    const auto& component = folder.component(item.key());
    sizes[item.key()] = component_bytes(component, folder.config(item.key()), io::DType::BF16);
    EXPECT_EQ(sizes[item.key()], item.value().get<int64_t>()) << item.key() << ": size from headers";
  }
  int cases = 0, default_cases = 0;
  for (const auto& c : oracle_doc["cases"]) {
    const auto dropped = dropped_by_diffusers(c["diffusers_map"], c["components"]);
    if (dropped.empty() != oracle) continue;
    SCOPED_TRACE(c.dump());
    std::vector<ComponentSize> components;
    for (const auto& name : c["components"]) components.push_back({name, sizes[name]});
    const auto placed = place_components_balanced(components, MaxMemory::from_json(c["max_memory"], "case"));
    const auto want = oracle ? as_pairs(c["diffusers_map"]) : our_fix_of_dropped(c["diffusers_map"], dropped);
    EXPECT_EQ(as_pairs(placed.device_map), want);

    // The CLI gives the same map; when the case places every component, also without --components.
    std::string names;
    for (const auto& name : c["components"]) names += (names.empty() ? "" : ",") + name.get<std::string>();
    const std::string command = dp::test::diffpipe_binary() + " plan --json --model " + model +
                                " --device-map auto --pipeline-device-map balanced --max-memory " + max_memory_flag(c["max_memory"]);
    auto result = dp::test::run_command(command + " --components " + names + " 2>/dev/null");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    if (result.exit_code != 0) continue;
    EXPECT_EQ(as_pairs(nlohmann::json::parse(result.output)["pipeline_hf_device_map"]), want);
    if (c["components"].size() == oracle_doc["sizes"].size()) {
      result = dp::test::run_command(command + " 2>/dev/null");
      EXPECT_EQ(result.exit_code, 0) << result.output;
      if (result.exit_code != 0) continue;
      EXPECT_EQ(as_pairs(nlohmann::json::parse(result.output)["pipeline_hf_device_map"]), want) << "by default";
      ++default_cases;
    }
    ++cases;
  }
  return {cases, default_cases};
}

TEST(PlacementOracle, PipelineLevelBalancedMatchesDiffusers) {
  const auto [cases, default_cases] = check_tiny_pipeline_cases(/*oracle=*/true);
  EXPECT_GE(cases, 8) << "too few cases where diffusers places every component";
  EXPECT_GE(default_cases, 1) << "no case places every component";
}

// Not an oracle comparison: where diffusers' map drops components (its overwrite bug), what we do instead.
TEST(PlacementOursNotOracle, PipelineBalancedPutsComponentsDiffusersDropsOnCpu) {
  const auto [cases, default_cases] = check_tiny_pipeline_cases(/*oracle=*/false);
  EXPECT_GE(cases, 1) << "no case exercises diffusers' overwrite bug";
}

// The full FLUX.1-dev folder make-random writes (headers only), once per test binary.
const std::string& flux_dev_pipeline_folder() {
  static const std::string model = [] {
    const std::string dir = dp::test::temp_dir("placement-flux-dev-pipeline") + "/FLUX.1-dev";
    const auto result = dp::test::run_command(dp::test::diffpipe_binary() +
                                              " make-random --pipeline --sparse --arch flux-dev --out " + dir + " 2>&1");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return dir;
  }();
  return model;
}

// `plan --pipeline-device-map balanced` on that folder without --components: every component, transformer
// included. `oracle` selects the cases where diffusers' map names every component (compared exactly), or else
// those where it drops some (compared with our fix). Returns the cases run and those with the transformer on
// a GPU.
std::pair<int, int> check_flux_dev_pipeline_cases(bool oracle) {
  const auto doc = oracle_json("flux_dev_pipeline_cases.json");
  const std::string& model = flux_dev_pipeline_folder();
  // Sizes from the headers are the ones diffusers computes from the configs, per run dtype.
  const auto folder = io::ModelFolder::open(model);
  nlohmann::json every_component = nlohmann::json::array();
  for (const auto& [dtype, sizes] : doc["sizes"].items()) {
    every_component = nlohmann::json::array();
    for (const auto& [name, bytes] : sizes.items()) {
      EXPECT_EQ(component_bytes(folder.component(name), folder.config(name), io::parse_run_dtype(dtype)),
                bytes.get<int64_t>())
          << name << " at " << dtype;
      every_component.push_back(name);
    }
  }
  EXPECT_EQ(every_component.size(), 4u) << "transformer, vae and the two text encoders";
  int cases = 0, transformer_on_gpu = 0;
  for (const auto& c : doc["cases"]) {
    const auto dropped = dropped_by_diffusers(c["diffusers_map"], every_component);
    if (dropped.empty() != oracle) continue;
    // The transformer's own map as accelerate's "auto" makes it (plan's default is the time-balanced "pipeline").
    const std::string command = dp::test::diffpipe_binary() + " plan --json --model " + model +
                                " --device-map auto --pipeline-device-map balanced --dtype " +
                                c["dtype"].get<std::string>() +
                                " --max-memory " + max_memory_flag(c["max_memory"]);
    SCOPED_TRACE(command);
    const auto result = dp::test::run_command(command + " 2>/dev/null");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    if (result.exit_code != 0) continue;
    const auto want = oracle ? as_pairs(c["diffusers_map"]) : our_fix_of_dropped(c["diffusers_map"], dropped);
    const auto got = as_pairs(nlohmann::json::parse(result.output)["pipeline_hf_device_map"]);
    EXPECT_EQ(got, want) << "\n got: " << describe(got) << "\nwant: " << describe(want);
    ++cases;
    transformer_on_gpu += c["diffusers_map"].value("transformer", nlohmann::json("cpu")).is_number() ? 1 : 0;
  }
  return {cases, transformer_on_gpu};
}

// Exactly where FluxPipeline.from_pretrained(folder, device_map="balanced", max_memory=...) puts every
// component (diffusers' own _get_final_device_map in the oracle).
TEST(PlacementOracle, PipelineBalancedPlacesEveryComponentOfFluxDevByDefaultAsDiffusers) {
  const auto [cases, transformer_on_gpu] = check_flux_dev_pipeline_cases(/*oracle=*/true);
  EXPECT_GE(cases, 8) << "too few cases where diffusers places every component";
  EXPECT_GE(transformer_on_gpu, 5) << "the transformer should be placed on a GPU in most cases";

  // The seed guide's encoders-only step (transformer=None, vae=None) names its components.
  const auto result = dp::test::run_command(dp::test::diffpipe_binary() + " plan --json --model " +
                                            flux_dev_pipeline_folder() +
                                            " --pipeline-device-map balanced --components text_encoder,text_encoder_2 "
                                            "--max-memory " + dp::test::source_dir() +
                                            "/configs/device_maps/seed_max_memory_16GB_x2.json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(as_pairs(nlohmann::json::parse(result.output)["pipeline_hf_device_map"]),
            (std::set<std::pair<std::string, std::string>>{{"text_encoder_2", "0"}, {"text_encoder", "1"}}));
}

// Not an oracle comparison: the FLUX.1-dev budgets where diffusers' map drops a component, and what we do.
TEST(PlacementOursNotOracle, FluxDevPipelineBalancedPutsComponentsDiffusersDropsOnCpu) {
  const auto [cases, transformer_on_gpu] = check_flux_dev_pipeline_cases(/*oracle=*/false);
  EXPECT_GE(cases, 1) << "no FLUX.1-dev case exercises diffusers' overwrite bug";
}

// Not an oracle comparison: the "disk" budgets where accelerate raises instead of giving a map. Our rule
// (balance without "disk", then walk with it) is pinned here so that a change to it shows; the oracle script
// records accelerate's error beside each, and drops the case from here once accelerate gives a map.
TEST(PlacementOursNotOracle, DiskBudgetsWhereAccelerateRaisesFollowOurRule) {
  const auto cases = oracle_json("ours_cases.json");
  ASSERT_GE(cases.size(), 3u) << "the FLUX.1-dev disk budget under auto, balanced and balanced_low_0";
  for (const auto& c : cases) {
    const std::string config_name = c["config"].get<std::string>();
    SCOPED_TRACE(config_name + " " + c["dtype"].get<std::string>() + " " + c["strategy"].get<std::string>() + " " +
                 c["max_memory"].dump());
    EXPECT_FALSE(c["accelerate_error"].get<std::string>().empty());
    EXPECT_TRUE(c["max_memory"].contains("disk")) << "accelerate only raises on a disk budget";
    const auto config_json = read_json_file(oracle_dir() + "/configs/" + config_name + ".json");
    const std::string model = header_only_model(config_json, config_name);
    const auto config = models::FluxConfig::from_json(config_json, config_name);
    const ModuleTree tree = flux_module_tree(config, io::WeightIndex::open_dir(model + "/transformer"),
                                             io::parse_run_dtype(c["dtype"].get<std::string>()));
    Strategy strategy;
    ASSERT_TRUE(parse_strategy(c["strategy"].get<std::string>(), &strategy));
    const auto placed = place_with_strategy(tree, strategy, MaxMemory::from_json(c["max_memory"], "case"));
    EXPECT_EQ(as_pairs(placed.device_map), as_pairs(c["our_rule"]));
    // The CLI plans the same.
    const auto result = dp::test::run_command(dp::test::diffpipe_binary() + " plan --json --model " + model +
                                              " --dtype " + c["dtype"].get<std::string>() + " --device-map " +
                                              c["strategy"].get<std::string>() + " --max-memory " +
                                              max_memory_flag(c["max_memory"]) + " 2>/dev/null");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_EQ(as_pairs(nlohmann::json::parse(result.output)["hf_device_map"]), as_pairs(c["our_rule"]));
  }
}

TEST(PlacementOracle, FluxDevAutoOnTwoLargeGpusMatchesTheHandComputedSplit) {
  // REFERENCE.md: embedders and transformer_blocks.0-16 on 0; the rest on 1.
  const ModuleTree tree = flux_module_tree(models::FluxConfig::flux_dev(), io::DType::BF16);
  EXPECT_EQ(tree.total_bytes(), 2 * 11'901'408'320LL);
  const auto placed = place_with_strategy(tree, Strategy::auto_, MaxMemory::parse("0=141GB,1=141GB"));
  std::map<std::string, std::string> got;
  for (const auto& [k, d] : placed.device_map) got[k] = to_string(d);
  EXPECT_EQ(got["transformer_blocks.16"], "0");
  EXPECT_EQ(got["transformer_blocks.17"], "1");
  EXPECT_EQ(got["single_transformer_blocks"], "1");
  EXPECT_EQ(got["x_embedder"], "0");
  EXPECT_EQ(got["proj_out"], "1");
}

// --fp8-gemms plans the blocks at FP8 sizes (15.2 GB for FLUX.1-dev against 23.8), so a GPU of 17 GB that
// "sequential" fills first holds all of them; a plan that would offload blocks is made at the checkpoint's sizes,
// the size offloaded blocks stream at, and says so; under --cuda-caps each GPU keeps a bf16 block free for the
// conversion.
TEST(PlacementFp8, BlocksSizedAsFp8ShareAGpuUnlessThePlanOffloads) {
  const std::string model = header_only_model(read_json_file(oracle_dir() + "/configs/flux_dev.json"), "flux_dev");
  const auto plan = [&](const std::string& flags) {
    const std::string command = dp::test::diffpipe_binary() + " plan --json --model " + model + " " + flags;
    const auto result = dp::test::run_command(command + " 2>/dev/null");
    EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.output;
    return nlohmann::json::parse(result.output);
  };
  const auto devices_used = [](const nlohmann::json& p) {
    std::set<std::string> used;
    for (const auto& [module, device] : as_pairs(p["hf_device_map"])) used.insert(device);
    return used;
  };
  const std::string two_gpus = "--device-map sequential --max-memory 0=17GB,1=141GB";
  const auto bf16 = plan(two_gpus);
  const auto fp8 = plan(two_gpus + " --fp8-gemms");
  EXPECT_EQ(devices_used(bf16), (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(devices_used(fp8), (std::set<std::string>{"0"}));
  EXPECT_EQ(fp8["block_weights"].get<std::string>().rfind("fp8", 0), 0U) << fp8["block_weights"];
  EXPECT_LT(fp8["transformer"]["total_bytes"].get<int64_t>(), 16'000'000'000);
  EXPECT_FALSE(bf16.contains("block_weights"));

  const std::string offloading = "--device-map auto --max-memory 0=10GB,cpu=100GB";
  const auto offloaded = plan(offloading + " --fp8-gemms");
  EXPECT_EQ(offloaded["block_weights"].get<std::string>().rfind("bf16", 0), 0U) << offloaded["block_weights"];
  EXPECT_EQ(as_pairs(offloaded["hf_device_map"]), as_pairs(plan(offloading)["hf_device_map"]));

  const auto capped = plan(two_gpus + " --fp8-gemms --cuda-caps");
  EXPECT_EQ(capped["fp8_converting_holdback_bytes"].get<int64_t>(), 679'662'592) << "one bf16 double block";

  // The microbatch choice (--simulate --prompts without a size) plans its candidates at the same sizes: one
  // 20 GB GPU holds the FP8 blocks, where in bf16 no size fits and plan says so.
  const std::string one_gpu = "--device-map pipeline --max-memory 0=20GB --cuda-caps --simulate --prompts 4";
  const auto chosen = plan(one_gpu + " --fp8-gemms");
  EXPECT_TRUE(chosen["microbatch_choice"]["candidates"][0]["fits"].get<bool>()) << chosen["microbatch_choice"];
  const auto refused = dp::test::run_command(dp::test::diffpipe_binary() + " plan --model " + model + " " + one_gpu);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("no microbatch size fits"), std::string::npos) << refused.output;
}

// "pipeline" against "balanced" for FLUX.1-dev on N H200s (141 GB each), at 1024x1024.
TEST(PlacementPipeline, BeatsBalancedOnImbalanceForFluxDev) {
  const auto config = models::FluxConfig::flux_dev();
  const ModuleTree tree = flux_module_tree(config, io::DType::BF16);
  for (const bool measured : {true, false}) {
    TimingModel timing;
    if (measured) {
      timing.double_block_ms = 3.07;
      timing.single_block_ms = 2.85;
    }
    const auto units = flux_timed_units(config, tree, timing);
    std::printf("[pipeline vs balanced] FLUX.1-dev bf16 1024x1024, %s\n",
                measured ? "measured H200 block times 3.07/2.85 ms" : "FLOPs at 400 TFLOP/s");
    for (int n : {2, 3, 4, 8}) {
      MaxMemory memory;
      std::vector<int> gpus;
      for (int g = 0; g < n; ++g) {
        memory.set(Device::gpu(g), 141'000'000'000);
        gpus.push_back(g);
      }
      const auto balanced = place_with_strategy(tree, Strategy::balanced, memory);
      const auto b = time_placement(units, tree, resolve_tensor_devices(tree, balanced.device_map, "balanced"), gpus, timing);
      const auto pipelined = plan_pipeline(config, tree, memory, timing, io::DType::BF16);
      const auto p = time_placement(units, tree, resolve_tensor_devices(tree, pipelined.device_map, "pipeline"), gpus, timing);
      auto stages = [](const TimingReport& r) {
        std::string s;
        for (const auto& st : r.stages) s += (s.empty() ? "" : " / ") + std::to_string(st.ms).substr(0, 6);
        return s;
      };
      std::printf("  %d GPUs: balanced max %.2f ms, imbalance %.3f, efficiency %.1f%% [%s]\n", n, b.max_ms,
                  b.imbalance(), 100 * b.efficiency(), stages(b).c_str());
      std::printf("          pipeline max %.2f ms, imbalance %.3f, efficiency %.1f%% [%s]  speed-up %.2fx\n",
                  p.max_ms, p.imbalance(), 100 * p.efficiency(), stages(p).c_str(), b.max_ms / p.max_ms);
      EXPECT_LT(p.imbalance(), b.imbalance()) << n << " GPUs";
      EXPECT_NEAR(p.total_ms, b.total_ms, 1e-6 * b.total_ms) << "same work, split differently";
      for (const auto& [device, bytes] : pipelined.weights)
        EXPECT_LE(bytes + pipelined.workspace_bytes, 141'000'000'000) << to_string(device);
    }
  }
}

TEST(PlacementPipeline, RespectsMemoryBudgetsAndFailsClearlyWhenNothingFits) {
  const auto config = models::FluxConfig::flux_dev();
  const ModuleTree tree = flux_module_tree(config, io::DType::BF16);
  TimingModel timing;
  // GPU 0 can hold only ~5 GB: the time-optimal even split must give way to memory.
  const auto placed = plan_pipeline(config, tree, MaxMemory::parse("0=5GB,1=141GB"), timing, io::DType::BF16);
  EXPECT_LE(placed.weights.at(Device::gpu(0)) + placed.workspace_bytes, 5'000'000'000);
  try {
    plan_pipeline(config, tree, MaxMemory::parse("0=10GB,1=10GB"), timing, io::DType::BF16);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot fit the transformer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device-map auto"), std::string::npos) << e.what();
  }
}

// bench/RESULTS.md (2026-12-04): "pipeline" gave rank 0 27 blocks under a 16 GB cap at 768x1360 and it ran out
// of memory while loading them. The plan now holds back what the allocator needs beyond weights and activations.
TEST(PlacementPipeline, HoldsBackTheAllocatorReserveOnCappedRanks) {
  constexpr int64_t kMiB = 1 << 20;
  EXPECT_EQ(allocator_weight_bytes(1), 512);
  EXPECT_EQ(allocator_weight_bytes(kMiB), kMiB);
  EXPECT_EQ(allocator_weight_bytes(kMiB + 1), 2 * kMiB);
  EXPECT_EQ(allocator_weight_bytes(18 * kMiB), 18 * kMiB);
  EXPECT_EQ(allocator_weight_bytes(19 * kMiB), 20 * kMiB);

  const auto config = models::FluxConfig::flux_dev();
  const int64_t reserve = allocator_reserve_bytes(config, io::DType::BF16);
  EXPECT_EQ(reserve, 128 * kMiB + 6 * 3072 * 3072 * 2 + 64 * kMiB + 128 * kMiB)
      << "BLAS workspaces, q/k/v while loading, coordinator, the modulation table";

  const ModuleTree tree = flux_module_tree(config, io::DType::BF16);
  TimingModel timing;
  timing.height = 768;
  timing.width = 1360;
  const auto placed = plan_pipeline(config, tree, MaxMemory::parse("0=16GB,1=16GB"), timing, io::DType::BF16,
                                    /*cuda_caps=*/true);
  EXPECT_EQ(placed.allocator_reserve_bytes, reserve);
  for (const auto& [device, bytes] : placed.weights)
    EXPECT_LE(bytes + placed.workspace_bytes + reserve, 16'000'000'000) << to_string(device);
  std::set<std::string> blocks_on_rank0;
  const auto devices = resolve_tensor_devices(tree, placed.device_map, "pipeline");
  for (const auto& tensor : tree.tensors_in_order()) {
    if (!(devices.at(tensor) == Device::gpu(0))) continue;
    const auto dot = tensor.find('.', tensor.find("blocks.") + 7);
    if (tensor.find("blocks.") != std::string::npos) blocks_on_rank0.insert(tensor.substr(0, dot));
  }
  EXPECT_LT(blocks_on_rank0.size(), 27u) << "the 27-block split that ran out of its 16 GB cap";
  EXPECT_GE(blocks_on_rank0.size(), 20u) << "the reserve is hundreds of MB, not gigabytes";
  // Without caps (a CPU run, or plan without --cuda-caps) the split is the one of bench/RESULTS.md.
  const auto uncapped = plan_pipeline(config, tree, MaxMemory::parse("0=16GB,1=16GB"), timing, io::DType::BF16);
  EXPECT_EQ(uncapped.allocator_reserve_bytes, 0);
  std::set<std::string> uncapped_rank0;
  const auto uncapped_devices = resolve_tensor_devices(tree, uncapped.device_map, "pipeline");
  for (const auto& tensor : tree.tensors_in_order())
    if (uncapped_devices.at(tensor) == Device::gpu(0) && tensor.find("blocks.") != std::string::npos)
      uncapped_rank0.insert(tensor.substr(0, tensor.find('.', tensor.find("blocks.") + 7)));
  EXPECT_EQ(uncapped_rank0.size(), 27u);
}

TEST(PlacementSeed, ExampleConfigsPlan) {
  const std::string model = header_only_model(models::FluxConfig::flux_dev().to_json(), "flux_dev");
  const std::string configs = dp::test::source_dir() + "/configs/device_maps";
  // The seed's custom dict: single_transformer_blocks.10-20 on GPU 1, embedders, double blocks and
  // single blocks 0-9 on GPU 0, the rest on cpu.
  auto result = dp::test::run_command(dp::test::diffpipe_binary() + " plan --json --model " + model +
                                      " --world-size 2 --device-map " + configs + "/flux_seed_custom.json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto plan = nlohmann::json::parse(result.output);
  const auto devices = plan["devices"];
  std::map<std::string, int64_t> weights;
  for (const auto& d : devices) weights[d["device"].dump()] = d["weights_bytes"].get<int64_t>();
  const ModuleTree tree = flux_module_tree(models::FluxConfig::flux_dev(), io::DType::BF16);
  EXPECT_EQ(weights["1"], 11 * tree.size_of("single_transformer_blocks.10")) << "11 single blocks on GPU 1";
  EXPECT_EQ(plan["hf_device_map"]["single_transformer_blocks.10"], 1);
  EXPECT_EQ(plan["hf_device_map"]["norm_out"], "cpu");
  // Human-readable output of the same plan, and the transformer "auto" with the seed's budgets.
  result = dp::test::run_command(dp::test::diffpipe_binary() + " plan --model " + model +
                                 " --device-map auto --max-memory " + configs + "/seed_max_memory_16GB_x2.json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("hf_device_map:"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("transformer_blocks.0-16"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("pipeline"), std::string::npos) << result.output;
  std::printf("%s\n", result.output.c_str());
}

TEST(PlacementSeed, TextEncodersBalancedOnTwo16GBGpus) {
  // FLUX.1-dev's text encoders as header-only checkpoints of their published parameter counts (bf16).
  const std::string dir = dp::test::temp_dir("placement-seed-encoders");
  dp::test::write_file(dir + "/model_index.json",
                       R"({"text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"]})");
  for (const auto& [name, numel] : std::vector<std::pair<std::string, int64_t>>{{"text_encoder", 123'060'480},
                                                                                {"text_encoder_2", 4'762'310'656}}) {
    fs::create_directories(dir + "/" + name);
    dp::test::write_file(dir + "/" + name + "/config.json", "{}");
    io::SafetensorsWriter writer;
    writer.add("all_parameters", io::DType::BF16, {numel});
    writer.write(dir + "/" + name + "/model.safetensors", [](std::size_t, void*, uint64_t) {}, true);
  }
  // The transformer is planned too (--device-map defaults to auto); this folder has none, so plan only the
  // components through the library.
  const auto folder = io::ModelFolder::open(dir);
  std::vector<ComponentSize> sizes;
  for (const char* name : {"text_encoder", "text_encoder_2"})
    sizes.push_back({name, component_bytes(folder.component(name), folder.config(name), io::DType::BF16)});
  const auto placed = place_components_balanced(
      sizes, read_max_memory_argument(dp::test::source_dir() + "/configs/device_maps/seed_max_memory_16GB_x2.json"));
  ASSERT_EQ(placed.device_map.size(), 2u);
  EXPECT_EQ(placed.device_map[0].first, "text_encoder_2");
  EXPECT_EQ(to_string(placed.device_map[0].second), "0");
  EXPECT_EQ(placed.device_map[1].first, "text_encoder");
  EXPECT_EQ(to_string(placed.device_map[1].second), "1");
}

}  // namespace
}  // namespace dp::placement
