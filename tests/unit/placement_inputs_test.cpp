// Every bad placement input is rejected with a message that names the key or value, by the library and by
// `diffpipe plan` (non-zero exit); max_memory strings parse as accelerate reads them, minus the bits trap.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "io/safetensors_writer.h"
#include "models/flux/flux_config.h"
#include "placement/auto_device_map.h"
#include "placement/custom_device_map.h"
#include "placement/device.h"
#include "placement/flux_module_tree.h"
#include "test_support.h"

namespace fs = std::filesystem;

namespace dp::placement {
namespace {

models::FluxConfig tiny_config() {
  auto c = models::FluxConfig::flux_dev();
  c.num_layers = 2;
  c.num_single_layers = 3;
  c.num_attention_heads = 2;
  c.attention_head_dim = 16;
  c.axes_dims_rope = {4, 6, 6};
  c.joint_attention_dim = 32;
  c.pooled_projection_dim = 16;
  c.in_channels = 8;
  return c;
}

std::string tiny_model() {
  static std::string dir;
  if (!dir.empty()) return dir;
  dir = dp::test::temp_dir("placement-inputs");
  fs::create_directories(dir + "/transformer");
  dp::test::write_file(dir + "/model_index.json", R"({"transformer": ["diffusers", "FluxTransformer2DModel"]})");
  dp::test::write_file(dir + "/transformer/config.json", tiny_config().to_json().dump());
  io::SafetensorsWriter writer;
  for (const auto& p : models::flux_parameter_shapes(tiny_config())) writer.add(p.name, io::DType::BF16, p.shape);
  writer.write(dir + "/transformer/diffusion_pytorch_model.safetensors", [](std::size_t, void*, uint64_t) {}, true);
  return dir;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const dp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(MaxMemory, ParsesSizesAsAccelerateDoes) {
  EXPECT_EQ(parse_memory_size("16GB", "t"), 16'000'000'000);
  EXPECT_EQ(parse_memory_size("16GiB", "t"), 16LL << 30);
  EXPECT_EQ(parse_memory_size("1.5GB", "t"), 1'500'000'000);
  EXPECT_EQ(parse_memory_size("512MiB", "t"), 512LL << 20);
  EXPECT_EQ(parse_memory_size("10KB", "t"), 10'000);
  EXPECT_EQ(parse_memory_size("123456", "t"), 123456);
  const auto m = MaxMemory::parse("cpu=64GB,1=16GiB,0=16GB,disk=1TB");
  ASSERT_EQ(m.entries().size(), 4u);
  EXPECT_EQ(to_string(m.entries()[0].first), "0");  // accelerate's order: GPUs, cpu, disk
  EXPECT_EQ(to_string(m.entries()[1].first), "1");
  EXPECT_EQ(to_string(m.entries()[2].first), "cpu");
  EXPECT_EQ(to_string(m.entries()[3].first), "disk");
  const auto j = MaxMemory::from_json(nlohmann::json::parse(R"({"0": "16GB", "1": 1000, "cpu": "1GiB"})"), "f.json");
  EXPECT_EQ(j.at(Device::gpu(1)), 1000);
}

TEST(MaxMemory, RejectsAmbiguousAndMalformedValues) {
  struct Case {
    std::string spec, expected;
  };
  for (const auto& c : std::vector<Case>{
           {"0=16Gb", "lowercase 'b', which accelerate reads as bits"},
           {"0=16gb", "lowercase 'b'"},
           {"0=16", ""},  // plain bytes: valid
           {"0=16XB", "unknown unit 'XB'"},
           {"0=GB", "must start with a number"},
           {"0=1.2.3GB", "must start with a number"},
           {"gpu0=16GB", "device 'gpu0' is not a GPU index"},
           {"-1=16GB", "device '-1' is not a GPU index"},
           {"0=16GB,0=8GB", "appears twice"},
           {"0:16GB", "must be DEVICE=SIZE"},
           {"", "empty"},
       }) {
    SCOPED_TRACE(c.spec);
    const std::string message = error_of([&] { MaxMemory::parse(c.spec); });
    if (c.expected.empty()) {
      EXPECT_EQ(message, "");
    } else {
      EXPECT_NE(message.find(c.expected), std::string::npos) << message;
    }
  }
  const std::string negative = error_of([] { MaxMemory::from_json(nlohmann::json::parse(R"({"0": -5})"), "mm.json"); });
  EXPECT_NE(negative.find("mm.json: max_memory key '0'"), std::string::npos) << negative;
  EXPECT_NE(negative.find("must not be negative"), std::string::npos) << negative;
  const std::string mps = error_of([] { MaxMemory::from_json(nlohmann::json::parse(R"({"mps": "1GB"})"), "mm.json"); });
  EXPECT_NE(mps.find("'mps'"), std::string::npos) << mps;
}

TEST(CustomDeviceMap, MostSpecificKeyWins) {
  const ModuleTree tree = flux_module_tree(tiny_config(), io::DType::BF16);
  const auto doc = nlohmann::ordered_json::parse(
      R"({"": "cpu", "transformer_blocks": 0, "transformer_blocks.1": 1, "transformer_blocks.1.attn.to_q.weight": "disk"})");
  const auto placed = resolve_custom_device_map(tree, doc, "map.json", 2);
  EXPECT_EQ(to_string(placed.tensor_devices.at("transformer_blocks.0.attn.to_q.weight")), "0");
  EXPECT_EQ(to_string(placed.tensor_devices.at("transformer_blocks.1.attn.to_k.weight")), "1");
  EXPECT_EQ(to_string(placed.tensor_devices.at("transformer_blocks.1.attn.to_q.weight")), "disk");
  EXPECT_EQ(to_string(placed.tensor_devices.at("proj_out.weight")), "cpu");
  ASSERT_EQ(placed.device_map.size(), 4u);  // hf_device_map is the user's dict, as diffusers keeps it
  EXPECT_EQ(placed.device_map[1].first, "transformer_blocks");
}

TEST(CustomDeviceMap, RejectsUnknownKeysUncoveredTensorsAndDevicesOutsideTheWorld) {
  const ModuleTree tree = flux_module_tree(tiny_config(), io::DType::BF16);
  struct Case {
    const char* json;
    std::vector<std::string> expected;
  };
  for (const auto& c : std::vector<Case>{
           {R"({"": 0, "transformer_blocks.7": 1})", {"map.json: key 'transformer_blocks.7'", "names no module"}},
           {R"({"": 0, "transformer_block": 1})", {"key 'transformer_block'", "names no module"}},
           {R"({"transformer_blocks": 0})", {"covered by no key", "time_text_embed.timestep_embedder.linear_1.weight"}},
           {R"({"": 2})", {"key ''", "device 2 is not in the world of 2 GPUs"}},
           {R"({"": "cuda:0"})", {"key ''", "device 'cuda:0' is not a GPU index"}},
           {R"({"": -1})", {"key ''", "must be >= 0"}},
           {R"({"": 1.5})", {"key ''", "must be a GPU index"}},
           {R"([1, 2])", {"map.json", "must be a non-empty JSON object"}},
           {R"({})", {"must be a non-empty JSON object"}},
       }) {
    SCOPED_TRACE(c.json);
    const std::string message =
        error_of([&] { resolve_custom_device_map(tree, nlohmann::ordered_json::parse(c.json), "map.json", 2); });
    ASSERT_FALSE(message.empty());
    for (const auto& part : c.expected) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST(FluxModuleTree, RejectsCheckpointsThatDoNotMatchTheConfig) {
  const std::string dir = dp::test::temp_dir("placement-bad-ckpt");
  auto write = [&](const std::function<void(io::SafetensorsWriter&)>& edit) {
    io::SafetensorsWriter writer;
    edit(writer);
    writer.write(dir + "/model.safetensors", [](std::size_t, void*, uint64_t) {}, true);
    return error_of([&] { flux_module_tree(tiny_config(), io::WeightIndex::open_dir(dir), io::DType::BF16); });
  };
  const auto shapes = models::flux_parameter_shapes(tiny_config());
  std::string message = write([&](io::SafetensorsWriter& w) {
    for (const auto& p : shapes) w.add(p.name, io::DType::BF16, p.shape);
    w.add("extra.weight", io::DType::BF16, {4});
  });
  EXPECT_NE(message.find("'extra.weight' is not a parameter"), std::string::npos) << message;
  message = write([&](io::SafetensorsWriter& w) {
    for (const auto& p : shapes) w.add(p.name, io::DType::BF16, p.name == "proj_out.bias" ? std::vector<int64_t>{3} : p.shape);
  });
  EXPECT_NE(message.find("'proj_out.bias' has shape [3]"), std::string::npos) << message;
  message = write([&](io::SafetensorsWriter& w) {
    for (const auto& p : shapes)
      if (p.name != "x_embedder.bias") w.add(p.name, io::DType::BF16, p.shape);
  });
  EXPECT_NE(message.find("no tensor 'x_embedder.bias'"), std::string::npos) << message;
}

TEST(Strategies, BalancedLow0NeedsGpusNumberedWithoutGaps) {
  const ModuleTree tree = flux_module_tree(tiny_config(), io::DType::BF16);
  const std::string message =
      error_of([&] { place_with_strategy(tree, Strategy::balanced_low_0, MaxMemory::parse("0=1000,2=1000")); });
  EXPECT_NE(message.find("max_memory has no GPU 1"), std::string::npos) << message;
}

struct CliCase {
  std::string args;
  std::vector<std::string> expected;
};

TEST(PlanCli, BadInputsExitNonZeroWithAClearMessage) {
  const std::string model = tiny_model();
  const std::string dir = dp::test::temp_dir("placement-cli");
  dp::test::write_file(dir + "/unknown_key.json", R"({"": 0, "transformer_blocks.9": 0})");
  dp::test::write_file(dir + "/uncovered.json", R"({"transformer_blocks": 0})");
  dp::test::write_file(dir + "/outside.json", R"({"": 3})");
  dp::test::write_file(dir + "/broken.json", R"({"": 0,)");
  dp::test::write_file(dir + "/mm.json", R"({"0": "16Gb"})");
  const std::string m = " --model " + model;
  for (const auto& c : std::vector<CliCase>{
           {m + " --max-memory 0=16Gb", {"'16Gb'", "lowercase 'b'", "bits"}},
           {m + " --max-memory 0=16XB", {"unknown unit 'XB'"}},
           {m + " --max-memory gpu=1GB", {"device 'gpu' is not a GPU index"}},
           {m + " --max-memory " + dir + "/mm.json", {"mm.json: max_memory key '0'", "lowercase 'b'"}},
           {m + " --max-memory 0=1GB,3=1GB --world-size 2", {"--max-memory key '3'", "not in the world of 2"}},
           {m + " --device-map fastest", {"--device-map 'fastest'", "neither a strategy"}},
           {m + " --device-map " + dir + "/unknown_key.json", {"key 'transformer_blocks.9'", "names no module"}},
           {m + " --device-map " + dir + "/uncovered.json", {"covered by no key"}},
           {m + " --device-map " + dir + "/outside.json --world-size 2", {"key ''", "device 3 is not in the world of 2"}},
           {m + " --device-map " + dir + "/broken.json", {"broken.json: not valid JSON"}},
           {m + " --pipeline-device-map auto", {"--pipeline-device-map 'auto'", "only \"balanced\""}},
           {m + " --pipeline-device-map balanced --components text_encoder", {"text_encoder"}},
           {m + " --dtype int8", {"--dtype 'int8'"}},
           {m + " --height 1000", {"resolution 1000x1024", "multiples of 16"}},
           {m + " --max-memory 0=1GB --device-map pipeline --height 1024", {}},  // world inferred: 1
           {m + " --world-size 0", {"--world-size must be positive"}},
           {m + " --world-size -2", {"--world-size must be positive"}},
           {m + " --block-times 3.07", {"--block-times '3.07'", "DOUBLE_MS,SINGLE_MS"}},
           {m + " --block-times a,b", {"--block-times 'a,b'"}},
           {m + " --device-map pipeline --max-memory 0=1000,1=1000", {"pipeline strategy cannot fit"}},
           {" --model /nonexistent/folder", {"/nonexistent/folder", "does not exist"}},
           {"", {"--model is required"}},
       }) {
    SCOPED_TRACE(c.args);
    const auto result = dp::test::run_command(dp::test::diffpipe_binary() + " plan" + c.args);
    if (c.expected.empty()) {
      EXPECT_EQ(result.exit_code, 0) << result.output;
      continue;
    }
    EXPECT_NE(result.exit_code, 0) << result.output;
    for (const auto& part : c.expected) EXPECT_NE(result.output.find(part), std::string::npos) << result.output;
  }
}

TEST(PlanCli, HelpDescribesEveryFlag) {
  const auto result = dp::test::run_command(dp::test::diffpipe_binary() + " plan --help");
  EXPECT_EQ(result.exit_code, 0);
  for (const char* flag : {"--model", "--device-map", "--pipeline-device-map", "--max-memory", "--world-size",
                           "--height", "--width", "--dtype", "--json", "--block-times"})
    EXPECT_NE(result.output.find(flag), std::string::npos) << flag;
}

TEST(PlanCli, RunsInSecondsWithoutGpuOrWeights) {
  const auto start = std::chrono::steady_clock::now();
  const auto result = dp::test::run_command(dp::test::diffpipe_binary() + " plan --json --model " + tiny_model() +
                                            " --device-map pipeline --world-size 2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_LT(seconds, 10.0);
}

}  // namespace
}  // namespace dp::placement
