// Calibration files (placement/calibration.h): read defensively, merged on write, matched only by the exact
// key (and saying why not), and, when used, the "pipeline" split follows the measured times instead of the
// FLOP model's.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "models/flux/flux_config.h"
#include "placement/calibration.h"
#include "placement/custom_device_map.h"
#include "placement/flux_module_tree.h"
#include "placement/microbatch_choice.h"
#include "placement/stage_timing.h"
#include "test_support.h"

namespace dp::placement {
namespace {

CalibrationEntry entry(const std::string& device, int64_t microbatch, double double_ms, double single_ms) {
  CalibrationEntry e;
  e.key = {device, "bf16", 1024, 1024, 512, microbatch};
  e.times = {0.2 * microbatch, double_ms, single_ms, 0.1 * microbatch};
  e.runs = 5;
  return e;
}

std::string expect_refused(const std::string& body) {
  const std::string path = dp::test::temp_dir("calibration-bad") + "/calibration.json";
  dp::test::write_file(path, body);
  try {
    read_calibration(path);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "names the file: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << body;
  return "";
}

TEST(PlacementCalibration, WritesMergesAndReadsBack) {
  const std::string path = dp::test::temp_dir("calibration") + "/sub/calibration.json";
  write_calibration(path, {entry("NVIDIA H200", 1, 3.1, 2.9), entry("NVIDIA H200", 2, 6.0, 5.5)});
  write_calibration(path, {entry("NVIDIA H200", 2, 5.8, 5.4), entry("cpu (2 threads)", 1, 900, 800)});
  const auto read = read_calibration(path);
  ASSERT_EQ(read.size(), 3u) << "the same key is replaced, new keys added";
  EXPECT_DOUBLE_EQ(read[1].times.double_block_ms, 5.8);
  EXPECT_EQ(read[2].key.device, "cpu (2 threads)");
}

TEST(PlacementCalibration, RefusesMalformedFilesNamingTheField) {
  const std::string good_entry =
      R"({"device": "X", "dtype": "bf16", "height": 1024, "width": 1024, "text_tokens": 512, "microbatch": 1,
          "embedders_ms": 0.1, "double_block_ms": 3, "single_block_ms": 2, "output_ms": 0.1, "runs": 3})";
  auto file = [](const std::string& entries) {
    return R"({"format": "diffpipe-calibration", "version": 1, "entries": [)" + entries + "]}";
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string e = good_entry;
    e.replace(e.find(from), from.size(), to);
    return file(e);
  };
  EXPECT_NE(expect_refused(R"({"format": "other", "version": 1, "entries": []})").find("'format'"), std::string::npos);
  EXPECT_NE(expect_refused(R"({"format": "diffpipe-calibration", "version": 9, "entries": []})").find("version 9"),
            std::string::npos);
  EXPECT_NE(expect_refused(replaced(R"("double_block_ms": 3)", R"("double_block_ms": -3)")).find("double_block_ms"),
            std::string::npos);
  EXPECT_NE(expect_refused(replaced(R"("single_block_ms": 2)", R"("single_block_ms": "2")")).find("single_block_ms"),
            std::string::npos);
  EXPECT_NE(expect_refused(replaced(R"("height": 1024)", R"("height": 1000)")).find("multiples of 16"), std::string::npos);
  EXPECT_NE(expect_refused(replaced(R"("runs": 3)", R"("runs": 3, "speed": 1)")).find("unknown field 'speed'"),
            std::string::npos);
  EXPECT_NE(expect_refused(replaced(R"("dtype": "bf16")", R"("dtype": "int8")")).find("'dtype'"), std::string::npos);
  EXPECT_NE(expect_refused(file(good_entry + "," + good_entry)).find("repeats the key"), std::string::npos);
  EXPECT_NE(expect_refused(R"({"format": "diffpipe-calibration", "format": "diffpipe-calibration"})").find("format"),
            std::string::npos);
  EXPECT_NE(expect_refused("{\"format\": ").find("JSON"), std::string::npos);
}

TEST(PlacementCalibration, MatchesOnlyTheExactKeyAndSaysWhyNot) {
  const std::vector<CalibrationEntry> entries = {entry("NVIDIA H200", 1, 3.1, 2.9), entry("NVIDIA H200", 2, 6, 5.5),
                                                 entry("NVIDIA A100", 1, 6, 5)};
  CalibrationKey key{"NVIDIA H200", "bf16", 1024, 1024, 512, 2};
  auto found = find_calibration(entries, key);
  ASSERT_TRUE(found.entry.has_value()) << found.reason;
  EXPECT_DOUBLE_EQ(found.entry->times.double_block_ms, 6);

  key.microbatch = 4;
  found = find_calibration(entries, key);
  EXPECT_FALSE(found.entry.has_value());
  EXPECT_NE(found.reason.find("microbatch 4"), std::string::npos) << found.reason;
  EXPECT_NE(found.reason.find("microbatch 2"), std::string::npos) << "lists what the file has: " << found.reason;

  key = {"NVIDIA H100", "bf16", 1024, 1024, 512, 1};
  found = find_calibration(entries, key);
  EXPECT_FALSE(found.entry.has_value());
  EXPECT_NE(found.reason.find("'NVIDIA H100'"), std::string::npos) << found.reason;
  EXPECT_NE(found.reason.find("'NVIDIA A100'"), std::string::npos) << found.reason;

  key.device = "";  // plan, on no device: two devices match the rest of the key
  found = find_calibration(entries, key);
  EXPECT_FALSE(found.entry.has_value());
  EXPECT_NE(found.reason.find("--calibration-device"), std::string::npos) << found.reason;
  key.dtype = "fp16";
  EXPECT_FALSE(find_calibration(entries, key).entry.has_value());

  // A missing default file is no error; a given one that is missing is.
  const std::string missing = dp::test::temp_dir("calibration-missing") + "/none.json";
  EXPECT_THROW(choose_calibration(missing, key), Error);
  ::setenv("DIFFPIPE_CALIBRATION", missing.c_str(), 1);
  const auto choice = choose_calibration("", key);
  ::unsetenv("DIFFPIPE_CALIBRATION");
  EXPECT_FALSE(choice.entry.has_value());
  EXPECT_NE(choice.message.find("FLOP-scaled"), std::string::npos) << choice.message;
}

TEST(PlacementCalibration, EfficiencyCurveFromSeveralMicrobatches) {
  const std::vector<CalibrationEntry> entries = {entry("G", 1, 4, 4), entry("G", 2, 6, 6), entry("G", 4, 14, 14)};
  const auto curve = calibrated_efficiency_curve(entries, {"G", "bf16", 1024, 1024, 512, 0});
  ASSERT_EQ(curve.size(), 3u);
  EXPECT_EQ(curve[0].first, 1);
  EXPECT_LT(curve[0].second, curve[1].second);
  EXPECT_DOUBLE_EQ(curve[1].second, 1.0) << "microbatch 2 is cheapest per image here";
  EXPECT_LT(curve[2].second, 1.0);
  EXPECT_TRUE(calibrated_efficiency_curve({entry("G", 1, 4, 4)}, {"G", "bf16", 1024, 1024, 512, 0}).empty());
}

// The blocks rank 0 holds under a pipeline split.
std::set<std::string> rank0_units(const models::FluxConfig& config, const ModuleTree& tree, const TimingModel& timing) {
  const auto placed = plan_pipeline(config, tree, MaxMemory::parse("0=141GB,1=141GB"), timing, io::DType::BF16);
  std::set<std::string> blocks;
  const auto devices = resolve_tensor_devices(tree, placed.device_map, "pipeline");
  for (const auto& tensor : tree.tensors_in_order()) {
    const auto at = tensor.find("blocks.");
    if (at != std::string::npos && devices.at(tensor) == Device::gpu(0))
      blocks.insert(tensor.substr(0, tensor.find('.', at + 7)));
  }
  return blocks;
}

TEST(PlacementCalibration, CalibratedTimesMoveThePipelineSplit) {
  const auto config = models::FluxConfig::flux_dev();
  const ModuleTree tree = flux_module_tree(config, io::DType::BF16);
  TimingModel flop;
  const auto flop_units = flux_timed_units(config, tree, flop);

  // The FLOP model gives double and single blocks about the same time (12 d^2 multiply-adds per token each); a
  // calibration where a double block costs 4x a single one must move blocks off the rank holding the doubles.
  TimingModel calibrated = flop;
  calibrated.calibrated = CalibratedTimes{0.3, 6.0, 1.5, 0.2};
  const auto units = flux_timed_units(config, tree, calibrated);
  for (const auto& u : units) {
    if (u.name.rfind("transformer_blocks.", 0) == 0) {
      EXPECT_DOUBLE_EQ(u.ms, 6.0) << u.name;
    }
    if (u.name.rfind("single_transformer_blocks.", 0) == 0) {
      EXPECT_DOUBLE_EQ(u.ms, 1.5) << u.name;
    }
  }
  EXPECT_DOUBLE_EQ(units.front().ms, 0.3);
  EXPECT_DOUBLE_EQ(units.back().ms, 0.2);
  EXPECT_NEAR(flop_units[1].ms / flop_units[config.num_layers + 1].ms, 1.0, 0.05) << "the FLOP model's ratio";

  const auto from_flops = rank0_units(config, tree, flop);
  const auto from_calibration = rank0_units(config, tree, calibrated);
  EXPECT_NE(from_flops, from_calibration) << "the split must move when the measured ratio differs";
  // FLOPs: about equal blocks, so 28 or 29 of the 57 on rank 0. Calibrated: 19 x 6 + 38 x 1.5 = 171 ms, so rank 0
  // stops at about 85 ms, i.e. 14 double blocks.
  EXPECT_GE(from_flops.size(), 28u);
  EXPECT_LE(from_flops.size(), 29u);
  EXPECT_GE(from_calibration.size(), 14u);
  EXPECT_LE(from_calibration.size(), 15u);
  for (const auto& block : from_calibration) EXPECT_EQ(block.rfind("transformer_blocks.", 0), 0u) << block;

  // With sequence parallelism a rank's share scales by its FLOPs: half the tokens, a little over half the time.
  TimingModel shared = calibrated;
  shared.sequence_parallel = 2;
  const auto shared_units = flux_timed_units(config, tree, shared);
  EXPECT_LT(shared_units[1].ms, 6.0);
  EXPECT_GT(shared_units[1].ms, 2.9);
}

// The microbatch size follows the efficiency curve and the image count (placement/microbatch_choice.h).
MicrobatchChoice choose(const EfficiencyCurve& curve, int64_t images, int gpus,
                        const std::vector<CalibrationEntry>& calibrations = {}) {
  static const auto config = models::FluxConfig::flux_dev();
  static const ModuleTree tree = flux_module_tree(config, io::DType::BF16);
  MicrobatchRequest r;
  r.config = config;
  r.tree = &tree;
  for (int g = 0; g < gpus; ++g) r.max_memory.set(Device::gpu(g), 141'000'000'000);
  r.timing.height = 768;
  r.timing.width = 1360;
  r.images = images;
  r.steps = 12;
  r.curve = curve;
  r.calibrations = calibrations;
  r.key = {"G", "bf16", 768, 1360, 512, 0};
  const auto choice = choose_microbatch(r);
  std::printf("[microbatch] %lld images on %d GPUs, %s: %s\n", static_cast<long long>(images), gpus,
              curve.source.c_str(), choice.reason.c_str());
  return choice;
}

EfficiencyCurve curve_of(std::vector<std::pair<int64_t, double>> points, const std::string& name) {
  EfficiencyCurve c;
  c.points = std::move(points);
  c.source = name;
  return c;
}

TEST(PlacementMicrobatch, ChoiceFollowsTheCurveAndTheImageCount) {
  const auto flat = curve_of({{1, 1.0}, {16, 1.0}}, "flat");
  const auto steep = curve_of({{1, 0.4}, {2, 0.6}, {4, 0.9}, {8, 1.0}}, "steep");
  // A flat curve gains nothing from larger microbatches; more microbatches fill the ring: the smallest size
  // within 1% of the best wins.
  EXPECT_EQ(choose(flat, 16, 2).size, 1);
  // A steep curve pays for larger microbatches as long as there are enough to keep both stages busy.
  const auto steep16 = choose(steep, 16, 2);
  EXPECT_GE(steep16.size, 4);
  // With few images the same curve gives way to keeping the stages busy: fewer images, a smaller size.
  const auto steep2 = choose(steep, 2, 2);
  EXPECT_LT(steep2.size, steep16.size);
  // One GPU has no ring to fill: the curve alone decides.
  EXPECT_EQ(choose(steep, 16, 1).size, 8);
  EXPECT_NE(steep16.reason.find("steep"), std::string::npos) << steep16.reason;
  EXPECT_NE(steep16.reason.find("images/s"), std::string::npos) << steep16.reason;

  // The default curve is stated and used without a calibration; calibrations of several sizes replace it.
  const auto defaults = efficiency_curve({}, {"G", "bf16", 768, 1360, 512, 0});
  EXPECT_NE(defaults.source.find("default"), std::string::npos);
  std::vector<CalibrationEntry> measured;
  for (const auto& [m, ms] : std::vector<std::pair<int64_t, double>>{{1, 10.0}, {2, 12.0}, {4, 16.0}}) {
    CalibrationEntry e;
    e.key = {"G", "bf16", 768, 1360, 512, m};
    e.times = {0.0, ms, ms, 0.0};
    e.runs = 3;
    measured.push_back(e);
  }
  const auto curve = efficiency_curve(measured, {"G", "bf16", 768, 1360, 512, 0});
  EXPECT_NE(curve.source.find("calibrated at microbatch 1, 2, 4"), std::string::npos) << curve.source;
  EXPECT_DOUBLE_EQ(curve.at(4), 1.0);
  EXPECT_DOUBLE_EQ(curve.at(1), 0.4);
  const auto calibrated = choose(curve, 16, 2, measured);
  EXPECT_EQ(calibrated.candidates[2].times, "calibrated");
  EXPECT_EQ(calibrated.candidates[3].times, "calibrated at 4, scaled");
  EXPECT_GE(calibrated.size, 4);
}

TEST(PlacementMicrobatch, MemoryCapsRuleOutLargeMicrobatches) {
  const auto config = models::FluxConfig::flux_dev();
  const ModuleTree tree = flux_module_tree(config, io::DType::BF16);
  MicrobatchRequest r;
  r.config = config;
  r.tree = &tree;
  r.max_memory = MaxMemory::parse("0=14GB,1=14GB");
  r.timing.height = 1024;
  r.timing.width = 1024;
  r.images = 16;
  r.curve = curve_of({{1, 0.4}, {16, 1.0}}, "steep");
  const auto choice = choose_microbatch(r);
  bool some_rejected = false;
  for (const auto& c : choice.candidates) some_rejected = some_rejected || !c.fits;
  EXPECT_TRUE(some_rejected) << choice.reason;
  for (const auto& c : choice.candidates) {
    if (c.size == choice.size) {
      EXPECT_TRUE(c.fits);
    }
  }
  EXPECT_NE(choice.reason.find("does not fit"), std::string::npos) << choice.reason;
}

// --fp8-gemms: candidates are planned at FP8 block sizes, as the run is (15.2 GB of FLUX.1-dev's blocks against
// 23.8 GB in bf16), and under CUDA caps each GPU keeps a bf16 block free for the conversion.
TEST(PlacementMicrobatch, Fp8BlockSizesFitWhereBf16DoesNotWithTheConversionHeldBack) {
  const auto config = models::FluxConfig::flux_dev();
  const ModuleTree tree = flux_module_tree(config, io::DType::BF16);
  const ModuleTree fp8_tree = flux_module_tree(config, io::DType::BF16, BlockWeights::fp8_gemms);
  MicrobatchRequest r;
  r.config = config;
  r.tree = &tree;
  r.cuda_caps = true;
  r.timing.height = 1024;
  r.timing.width = 1024;
  r.images = 4;
  r.curve = curve_of({{1, 1.0}, {4, 1.0}}, "flat");
  const auto fits = [&](int64_t cap) {
    r.max_memory = MaxMemory();
    r.max_memory.set(Device::gpu(0), cap);
    try {
      return choose_microbatch(r).candidates.front().fits;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no microbatch size fits"), std::string::npos) << e.what();
      return false;
    }
  };
  EXPECT_FALSE(fits(20'000'000'000));
  r.fp8_tree = &fp8_tree;
  EXPECT_TRUE(fits(20'000'000'000));

  // The smallest cap (to 50 MB) at which one GPU holds the FP8 blocks with no conversion held back ...
  int64_t smallest = 0;
  for (int64_t cap = 15'000'000'000; cap <= 20'000'000'000 && smallest == 0; cap += 50'000'000) {
    MaxMemory one_gpu;
    one_gpu.set(Device::gpu(0), cap);
    try {
      plan_pipeline(config, fp8_tree, one_gpu, r.timing, io::DType::BF16, true);
      smallest = cap;
    } catch (const Error&) {
    }
  }
  ASSERT_GT(smallest, 0);
  // ... is too small for the choice, which also keeps the largest bf16 block (a double block) free.
  const int64_t holdback = flux_largest_block_bytes(config, tree);
  EXPECT_EQ(holdback, 679'662'592);
  EXPECT_FALSE(fits(smallest + holdback / 2));
  EXPECT_TRUE(fits(smallest + holdback));
}

}  // namespace
}  // namespace dp::placement
