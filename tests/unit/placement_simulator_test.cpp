// The ring-schedule simulator (placement/ring_simulator.h) against cases with closed-form answers: a full
// pipeline of equal stages, one stage, one microbatch, a link slower than every stage, sends that block the
// sender; then FLUX message sizes and stage times, the ranks a map needs, and `plan --simulate` end to end.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors_writer.h"
#include "models/flux/flux_config.h"
#include "placement/flux_module_tree.h"
#include "placement/ring_simulator.h"
#include "placement/stage_timing.h"
#include "test_support.h"

namespace fs = std::filesystem;

namespace dp::placement {
namespace {

// Stages of equal time on the given ranks, nothing to send, no Euler time: pure schedule.
RingSimulationInput free_links(std::vector<int> ranks, double stage_ms, int64_t images, int steps) {
  RingSimulationInput in;
  in.stage_ranks = std::move(ranks);
  in.stage_ms.assign(in.stage_ranks.size(), stage_ms);
  in.link = {"free", 1.0, 0.0};
  in.images = images;
  in.microbatch_size = 1;
  in.steps = steps;
  in.euler_ms = 0;
  return in;
}

std::vector<int> ranks_from(int first, int count) {
  std::vector<int> ranks;
  for (int i = 0; i < count; ++i) ranks.push_back(first + i);
  return ranks;
}

TEST(PlacementSimulator, EqualStagesFillThePipeOnce) {
  const double t = 7.5;
  for (int n : {1, 2, 3, 5, 8}) {
    for (int first_rank : {0, 1}) {  // rank 0 runs the first stage itself, or only coordinates
      for (int64_t m : {static_cast<int64_t>(n), static_cast<int64_t>(n) + 1, 3 * static_cast<int64_t>(n) + 2}) {
        for (int steps : {1, 4}) {
          const auto sim = simulate_ring(free_links(ranks_from(first_rank, n), t, m, steps));
          const double slots = static_cast<double>(m * steps + n - 1);
          SCOPED_TRACE(str(n, " stages from rank ", first_rank, ", ", m, " microbatches, ", steps, " steps"));
          EXPECT_NEAR(sim.total_ms, slots * t, 1e-9 * slots * t);
          EXPECT_NEAR(sim.bubble_fraction, (n - 1) / slots, 1e-12);
          EXPECT_NEAR(sim.images_per_s, static_cast<double>(m) / (slots * t * 1e-3), 1e-9 * sim.images_per_s);
          ASSERT_EQ(sim.stages.size(), static_cast<size_t>(n));
          for (const auto& stage : sim.stages) {
            EXPECT_NEAR(stage.compute_ms, static_cast<double>(m * steps) * t, 1e-9);
            EXPECT_NEAR(stage.busy_fraction, m * steps / slots, 1e-12);
          }
        }
      }
    }
  }
}

TEST(PlacementSimulator, OneStageRunsEveryStepInTurn) {
  // On rank 0: nothing leaves it, and the Euler update runs between the stage's steps.
  auto in = free_links({0}, 12.0, 6, 5);
  in.euler_ms = 0.5;
  in.activation_bytes_per_image = in.noise_bytes_per_image = 1'000'000;  // no boundary to cross
  in.link = link_preset("pcie");
  auto sim = simulate_ring(in);
  EXPECT_NEAR(sim.total_ms, 6 * 5 * (12.0 + 0.5), 1e-9);
  EXPECT_TRUE(sim.links.empty());
  EXPECT_NEAR(sim.coordinator_busy_fraction, 1.0, 1e-12);
  // Without the Euler time: M x S x t exactly.
  in.euler_ms = 0;
  EXPECT_NEAR(simulate_ring(in).total_ms, 6 * 5 * 12.0, 1e-9);
  // A last microbatch of 1 image out of microbatches of 2 takes half a microbatch's time.
  in.images = 5;
  in.microbatch_size = 2;
  sim = simulate_ring(in);
  EXPECT_EQ(sim.microbatches, 3);
  EXPECT_NEAR(sim.total_ms, 5 * (12.0 + 12.0 + 6.0), 1e-9);
}

TEST(PlacementSimulator, OnePromptWaitsForTheWholeRingEveryStep) {
  // Unequal stages on ranks 1-3, rank 0 only coordinating: each step crosses four links and three stages.
  RingSimulationInput in;
  in.stage_ranks = {1, 2, 3};
  in.stage_ms = {3.0, 5.0, 7.0};
  in.prompt_bytes_per_image = 4'000'000;
  in.step_input_bytes_per_image = 500'000;
  in.activation_bytes_per_image = 28'000'000;
  in.noise_bytes_per_image = 500'000;
  in.link = {"test", 10.0, 4.0};
  in.images = 1;
  in.steps = 9;
  in.euler_ms = 0.25;
  const auto ms = [&](int64_t bytes) { return 4e-3 + static_cast<double>(bytes) / 10e9 * 1e3; };
  const double per_step = 3.0 + 5.0 + 7.0 + ms(500'000) + 2 * ms(28'000'000) + ms(500'000) + 0.25;
  for (const bool overlap : {true, false}) {
    in.transfers_overlap_compute = overlap;
    const auto sim = simulate_ring(in);
    EXPECT_NEAR(sim.total_ms, ms(4'000'000) + 9 * per_step, 1e-9) << "overlap " << overlap;
    ASSERT_EQ(sim.links.size(), 4u);
    EXPECT_EQ(sim.links[0].from_rank, 0);
    EXPECT_EQ(sim.links[0].to_rank, 1);
    EXPECT_EQ(sim.links[0].bytes_per_step, 500'000);
    EXPECT_EQ(sim.links[0].bytes_total, 9 * 500'000 + 4'000'000);  // the prompt goes once
    EXPECT_EQ(sim.links[1].bytes_per_step, 28'000'000);
    EXPECT_EQ(sim.links[2].bytes_total, 9 * 28'000'000LL);
    EXPECT_EQ(sim.links[3].from_rank, 3);
    EXPECT_EQ(sim.links[3].to_rank, 0);
  }
}

TEST(PlacementSimulator, ASlowLinkSetsThePace) {
  // Stages of 1 ms but 10 ms to move activations: each boundary link carries one microbatch step per 10 ms.
  RingSimulationInput in = free_links({0, 1, 2, 3}, 1.0, 8, 3);
  in.link = {"slow", 1.0, 0.0};
  in.activation_bytes_per_image = 10'000'000;  // 10 ms at 1 GB/s
  const auto sim = simulate_ring(in);
  const double link_bound = 8 * 3 * 10.0;
  const double one_trip = 4 * 1.0 + 3 * 10.0;
  EXPECT_GE(sim.total_ms, link_bound);
  EXPECT_LE(sim.total_ms, link_bound + one_trip);
  EXPECT_NEAR(sim.images_per_s, 8 / (link_bound * 1e-3), 0.15 * sim.images_per_s);
  EXPECT_GT(sim.bubble_fraction, 0.85);
  ASSERT_EQ(sim.links.size(), 4u);  // 0 -> 1 -> 2 -> 3 -> 0 (rank 0 runs the first stage)
  EXPECT_EQ(sim.links[3].bytes_total, 0) << "the noise has no bytes here";
  for (int l = 0; l < 3; ++l) EXPECT_GT(sim.links[l].busy_fraction, 0.85) << "boundary " << l;
}

TEST(PlacementSimulator, SendsThatBlockAddToTheSlowestStage) {
  // Two stages of 10 ms on ranks 1 and 2; crossing between them takes 5 ms; 20 microbatches, 2 steps.
  RingSimulationInput in = free_links({1, 2}, 10.0, 20, 2);
  in.link = {"test", 1.0, 0.0};
  in.activation_bytes_per_image = 5'000'000;
  const int64_t items = 20 * 2;
  // Overlapped: two steps in flight (one per stage) and a round trip of 10 + 5 + 10 ms, so the ring turns
  // out a pair every 25 ms (the transfer is not hidden: the depth, not a stage, sets the pace). The first
  // pair is back at 35 ms.
  in.transfers_overlap_compute = true;
  const auto overlapped = simulate_ring(in);
  EXPECT_NEAR(overlapped.total_ms, 35.0 + (items / 2 - 1) * 25.0, 1e-9);
  // One more step in flight hides it: stage 0 never waits, and the last step leaves it at items x 10 ms.
  in.max_in_flight = 3;
  EXPECT_NEAR(simulate_ring(in).total_ms, items * 10.0 + 5.0 + 10.0, 1e-9);
  in.max_in_flight = 0;
  // Blocking: stage 0 holds each step for 10 + 5 ms, and the last one needs 10 more on stage 1.
  in.transfers_overlap_compute = false;
  const auto blocking = simulate_ring(in);
  EXPECT_NEAR(blocking.total_ms, items * 15.0 + 10.0, 1e-9);
  EXPECT_NEAR(blocking.stages[0].compute_ms, items * 10.0, 1e-9) << "waiting on a send is not compute";
}

TEST(PlacementSimulator, ThroughputGrowsWithPromptsUpToTheRingDepth) {
  RingSimulationInput in;
  in.stage_ranks = {0, 1, 2, 3};
  in.stage_ms = {40.0, 42.0, 41.0, 43.0};
  in.activation_bytes_per_image = 28'317'696;
  in.step_input_bytes_per_image = in.noise_bytes_per_image = 524'288;
  in.link = link_preset("pcie");
  in.steps = 28;
  double previous = 0;
  for (int64_t m = 1; m <= 4; ++m) {
    in.images = m;
    const double ips = simulate_ring(in).images_per_s;
    EXPECT_GT(ips, previous * 1.2) << m << " prompts";
    previous = ips;
  }
  in.images = 16;  // past the depth: no worse, bounded by the slowest stage
  const double deep = simulate_ring(in).images_per_s;
  EXPECT_GE(deep, previous * 0.999);
  EXPECT_LE(deep, 1000.0 / (43.0 * 28));
}

TEST(PlacementSimulator, RejectsWhatTheRuntimeWouldNot) {
  auto expect_error = [](RingSimulationInput in, const std::string& part) {
    try {
      simulate_ring(in);
      ADD_FAILURE() << "expected an error containing '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error(free_links({1, 0}, 1.0, 2, 2), "coordinator can only run the first stage");
  expect_error(free_links({1, 2, 1}, 1.0, 2, 2), "visits each rank once");
  expect_error(free_links({}, 1.0, 2, 2), "at least one stage");
  expect_error(free_links({0, 1}, -1.0, 2, 2), "non-negative");
  expect_error(free_links({0, 1}, 1.0, 0, 2), "at least one image");
  expect_error(free_links({0, 1}, 1.0, 2, 0), "--steps");
  auto in = free_links({0, 1}, 1.0, 2, 2);
  in.link.gb_per_s = 0;
  expect_error(in, "bandwidth");
  try {
    link_preset("infiniband");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nvlink, pcie, ib"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(link_preset("nvlink").gb_per_s, 450.0);
  EXPECT_DOUBLE_EQ(link_preset("pcie").latency_us, 5.0);
}

TEST(PlacementSimulator, FluxMessagesAndStageTimes) {
  const auto config = models::FluxConfig::flux_dev();
  const auto bytes = flux_ring_message_bytes(config, 1024, 1024, 512, io::DType::BF16);
  EXPECT_EQ(bytes.activations, 2 * (4096 + 512 + 1) * 3072LL);  // image, text, temb in bf16
  EXPECT_EQ(bytes.step_inputs, 2 * (4096 * 64 + 1) + 4LL);      // latents, timestep; guidance in fp32
  EXPECT_EQ(bytes.noise, 2 * 4096 * 64LL);
  EXPECT_EQ(bytes.prompts, 2 * (512 * 4096 + 768LL));

  TimingModel timing;
  timing.double_block_ms = 3.07;
  timing.single_block_ms = 2.85;
  const auto units = flux_timed_units(config, flux_module_tree(config, io::DType::BF16), timing);
  const auto ms = flux_ring_stage_ms(units, {{0, 0, 19}, {1, 19, 57}});
  ASSERT_EQ(ms.size(), 2u);
  double all = 0;
  for (const auto& u : units) all += u.ms;
  EXPECT_NEAR(ms[0] + ms[1], all, 1e-9);
  EXPECT_NEAR(ms[0], units.front().ms + 19 * 3.07, 1e-6) << "the embedders run on the first stage";
  EXPECT_NEAR(ms[1], 38 * 2.85 + units.back().ms, 1e-6) << "the output layers run on the last stage";
}

TEST(PlacementSimulator, RanksAMapNeeds) {
  const auto config = models::FluxConfig::flux_dev();
  auto ranks = map_ranks(nlohmann::ordered_json{{"", 0}}, config);
  EXPECT_EQ(ranks.ranks, 1);
  ASSERT_EQ(ranks.stages.size(), 1u);
  EXPECT_TRUE(ranks.unsupported.empty());

  // Blocks on GPUs 1 and 3: four ranks, rank 0 and 2 without blocks.
  ranks = map_ranks(nlohmann::ordered_json{{"x_embedder", 0}, {"transformer_blocks", 1},
                                           {"single_transformer_blocks", 3}, {"proj_out", 3}},
                    config);
  EXPECT_EQ(ranks.ranks, 4);
  EXPECT_EQ(ranks.gpus_with_blocks, (std::vector<int>{1, 3}));
  EXPECT_EQ(to_json(ranks)["launch"], "mpirun -np 4");

  // Offloaded blocks run on the GPU rank whose range they continue (placement_ring_stages_test has the rule).
  ranks = map_ranks(nlohmann::ordered_json{{"transformer_blocks", 0}, {"single_transformer_blocks", "cpu"}}, config);
  EXPECT_EQ(ranks.ranks, 1);
  ASSERT_EQ(ranks.stages.size(), 1u);
  EXPECT_EQ(ranks.stages[0].last_block, 57);
  EXPECT_EQ(ranks.stages[0].offloaded.size(), 38u);
  EXPECT_TRUE(ranks.unsupported.empty()) << ranks.unsupported;

  ranks = map_ranks(nlohmann::ordered_json{{"transformer_blocks", 1}, {"single_transformer_blocks", 0}}, config);
  EXPECT_EQ(ranks.ranks, 2);
  EXPECT_NE(ranks.unsupported.find("only start the ring"), std::string::npos) << ranks.unsupported;
}

// --- `diffpipe plan --simulate` ---

std::string flux_dev_headers() {
  static const std::string dir = [] {
    const std::string d = dp::test::temp_dir("simulator-flux-dev");
    fs::create_directories(d + "/transformer");
    dp::test::write_file(d + "/model_index.json",
                         R"({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]})");
    const auto config = models::FluxConfig::flux_dev();
    dp::test::write_file(d + "/transformer/config.json", config.to_json().dump(2));
    io::SafetensorsWriter writer;
    for (const auto& p : models::flux_parameter_shapes(config)) writer.add(p.name, io::DType::BF16, p.shape);
    writer.write(d + "/transformer/diffusion_pytorch_model.safetensors", [](std::size_t, void*, uint64_t) {}, true);
    return d;
  }();
  return dir;
}

dp::test::CommandResult plan(const std::string& arguments) {
  return dp::test::run_command(dp::test::diffpipe_binary() + " plan --model " + flux_dev_headers() + " " + arguments);
}

TEST(PlanSimulate, PrintsTheRingOfEveryMap) {
  const auto result = plan("--world-size 2 --device-map auto --block-times 3.07,2.85 --simulate --link pcie");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* field : {"ranks: 2", "mpirun -np 2", "simulated denoising ring", "images/s", "1-prompt s", "bubble",
                            "efficiency", "busy per stage", "link pcie: 25.0 GB/s", "bytes per denoising step / in total", "0->1",
                            "1->0"})
    EXPECT_NE(result.output.find(field), std::string::npos) << "missing '" << field << "' in\n" << result.output;
  std::printf("%s\n", result.output.c_str());
}

TEST(PlanSimulate, JsonParsesAndAgreesWithTheLibrary) {
  // --microbatch-size 1: the library's ring below runs one image per microbatch (without it plan chooses one).
  const auto result = plan("--world-size 2 --device-map pipeline --block-times 3.07,2.85 --simulate --prompts 4 "
                           "--microbatch-size 1 --steps 10 --link-gbps 50 --link-latency-us 1 --json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto json = nlohmann::json::parse(result.output);
  EXPECT_EQ(json["ranks"]["ranks"], 2);
  EXPECT_EQ(json["ranks"]["launch"], "mpirun -np 2");
  EXPECT_EQ(json["comparison"]["balanced"]["ranks"]["ranks"], 2);
  const auto& sim = json["simulation"];
  EXPECT_EQ(sim["link"]["name"], "custom");
  EXPECT_EQ(sim["link"]["gb_per_s"], 50.0);
  ASSERT_EQ(sim["maps"].size(), 2u) << "pipeline (asked for) and balanced";
  const auto& pipeline = sim["maps"][0];
  EXPECT_EQ(pipeline["map"], "pipeline");
  EXPECT_EQ(pipeline["stage_times_from"], "plan");
  ASSERT_EQ(pipeline["runs"].size(), 1u);
  const auto& run = pipeline["runs"][0];
  for (const char* key : {"total_s", "images_per_s", "bubble_fraction", "efficiency", "one_gpu_images_per_s", "stages",
                          "links"})
    EXPECT_TRUE(run.contains(key)) << key;
  EXPECT_EQ(run["images"], 4);
  EXPECT_GT(run["efficiency"].get<double>(), 0.5);
  EXPECT_LE(run["efficiency"].get<double>(), 1.0);
  EXPECT_EQ(run["links"][0]["bytes_per_step"], 4 * 2 * (4096 + 512 + 1) * 3072LL);

  // The same ring through the library gives the same figures.
  RingSimulationInput in;
  for (const auto& s : json["ranks"]["ring"]) in.stage_ranks.push_back(s["rank"].get<int>());
  in.stage_ms = pipeline["stage_ms"].get<std::vector<double>>();
  const auto bytes = flux_ring_message_bytes(models::FluxConfig::flux_dev(), 1024, 1024, 512, io::DType::BF16);
  in.prompt_bytes_per_image = bytes.prompts;
  in.step_input_bytes_per_image = bytes.step_inputs;
  in.activation_bytes_per_image = bytes.activations;
  in.noise_bytes_per_image = bytes.noise;
  in.link = {"custom", 50.0, 1.0};
  in.images = 4;
  in.steps = 10;
  EXPECT_NEAR(run["total_s"].get<double>(), simulate_ring(in).total_ms * 1e-3, 1e-12);
}

TEST(PlanSimulate, OffloadedBlocksJoinARankAndAreSimulated) {
  // The seed's custom map keeps the last single blocks on cpu: they run on rank 1, whose range they continue.
  const std::string map = dp::test::source_dir() + "/configs/device_maps/flux_seed_custom.json";
  auto result = plan("--world-size 2 --device-map " + map + " --simulate --prompts 2 --json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto json = nlohmann::json::parse(result.output);
  EXPECT_EQ(json["ranks"]["ranks"], 2);
  EXPECT_FALSE(json["ranks"].contains("unsupported")) << json["ranks"];
  ASSERT_EQ(json["ranks"]["ring"].size(), 2u);
  EXPECT_EQ(json["ranks"]["ring"][1]["last_block"], 57);
  EXPECT_EQ(json["ranks"]["ring"][1]["offloaded"][0]["block"], 19 + 21);
  EXPECT_EQ(json["ranks"]["ring"][1]["offloaded"][0]["tier"], "cpu");
  EXPECT_TRUE(json["simulation"]["maps"][0].contains("runs")) << json["simulation"]["maps"][0];
  result = plan("--world-size 2 --device-map " + map + " --simulate");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("offloaded (40-"), std::string::npos) << result.output;
}

TEST(PlanSimulate, AMapTheRuntimeCannotRunIsNamedNotSimulated) {
  // Rank 0 on both sides of rank 1: the ring would visit rank 0 twice.
  const std::string map = dp::test::temp_dir("simulator-twice") + "/twice.json";
  dp::test::write_file(map, R"({"": 0, "single_transformer_blocks": 1, "single_transformer_blocks.37": 0})");
  auto result = plan("--world-size 2 --device-map " + map + " --simulate --prompts 2 --json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto json = nlohmann::json::parse(result.output);
  EXPECT_EQ(json["ranks"]["ranks"], 2);
  EXPECT_NE(json["ranks"]["unsupported"].get<std::string>().find("not contiguous"), std::string::npos) << json["ranks"];
  const auto& maps = json["simulation"]["maps"];
  ASSERT_EQ(maps.size(), 3u);
  EXPECT_TRUE(maps[0].contains("unsupported"));
  EXPECT_FALSE(maps[0].contains("runs"));
  EXPECT_TRUE(maps[2].contains("runs")) << "pipeline is still simulated";
  result = plan("--world-size 2 --device-map " + map + " --simulate");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("twice.json       not simulated"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("the multi-rank runtime cannot run this map"), std::string::npos) << result.output;
  result = plan("--world-size 2 --device-map " + map + " --simulate --stage-ms 1,2");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("cannot run as a ring"), std::string::npos) << result.output;
}

// accelerate's auto fills each GPU with weights up to max_memory; on CUDA the runtime also caps the allocator
// there, so `generate --device cuda --max-memory` (and `plan --cuda-caps`) place weights in max_memory less the
// activations, the allocator reserve and the double buffer of streamed blocks.
TEST(PlanCudaCaps, AutoLeavesRoomBesideTheWeightsOnCappedGpus) {
  const std::string common = "--device-map auto --max-memory 0=8GB,1=8GB,cpu=64GB --height 768 --width 1360 --json";
  auto result = plan(common + " 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto accelerate = nlohmann::json::parse(result.output);
  result = plan(common + " --cuda-caps 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto capped = nlohmann::json::parse(result.output);
  EXPECT_FALSE(accelerate["transformer"].contains("runtime_holdback_bytes")) << "without the flag: accelerate's map";
  const int64_t holdback = capped["transformer"]["runtime_holdback_bytes"].get<int64_t>();
  const auto config = models::FluxConfig::flux_dev();
  const int64_t double_block = 2 * (2 * 6 * 3072LL * 3072 + 6 * 3072LL * 3072 + 2 * 3072LL * 3072 + 4 * 4 * 3072LL * 3072);
  EXPECT_GE(holdback, allocator_reserve_bytes(config, io::DType::BF16) + 2 * double_block) << holdback;
  EXPECT_LT(holdback, 3'000'000'000) << holdback;
  for (int gpu = 0; gpu < 2; ++gpu) {
    const int64_t weights = capped["devices"][gpu]["weights_bytes"].get<int64_t>();
    EXPECT_LE(weights + holdback, 8'000'000'000) << "GPU " << gpu;
    EXPECT_EQ(capped["devices"][gpu]["budget_bytes"], 8'000'000'000) << "the cap stays max_memory";
  }
  EXPECT_GT(accelerate["devices"][1]["weights_bytes"].get<int64_t>() + holdback, 8'000'000'000)
      << "accelerate's own map leaves GPU 1 no room: the case the flag exists for";
  // Every block still runs; the offloaded ones on rank 1, whose range they continue.
  const auto& ring = capped["ranks"]["ring"];
  ASSERT_EQ(ring.size(), 2u) << capped["ranks"];
  EXPECT_EQ(ring[1]["last_block"], 57);
  EXPECT_GT(ring[1]["offloaded"].size(), accelerate["ranks"]["ring"][1]["offloaded"].size());
}

TEST(PlanSimulate, MicrobatchesOfSeveralImages) {
  // 3 prompts x 2 images in microbatches of 4: a full microbatch and one of 2 images, each stage taking
  // four images' time for the first (the plan is made for --microbatch-size, as generate makes it).
  const auto one = nlohmann::json::parse(
      plan("--world-size 2 --device-map pipeline --simulate --prompts 3 --json 2>/dev/null").output);
  const auto four = nlohmann::json::parse(plan("--world-size 2 --device-map pipeline --simulate --prompts 3 "
                                               "--num-images-per-prompt 2 --microbatch-size 4 --json 2>/dev/null")
                                              .output);
  const auto& run = four["simulation"]["maps"][0]["runs"][0];
  EXPECT_EQ(run["images"], 6);
  EXPECT_EQ(run["microbatches"], 2);
  EXPECT_EQ(four["simulation"]["microbatch_size"], 4);
  const auto ms1 = one["simulation"]["maps"][0]["stage_ms"].get<std::vector<double>>();
  const auto ms4 = four["simulation"]["maps"][0]["stage_ms"].get<std::vector<double>>();
  ASSERT_EQ(ms1.size(), ms4.size());
  for (size_t i = 0; i < ms1.size(); ++i) EXPECT_NEAR(ms4[i], 4 * ms1[i], 1e-9 * ms4[i]) << "stage " << i;
  EXPECT_EQ(run["links"][0]["bytes_per_step"], 6 * 2 * (4096 + 512 + 1) * 3072LL);
}

TEST(PlanSimulate, SweepCoversOneToSixtyFourGpus) {
  const auto result = plan("--world-size 3 --block-times 3.07,2.85 --simulate-sweep --json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto rows = nlohmann::json::parse(result.output)["simulation_sweep"]["rows"];
  std::map<int, std::vector<int64_t>> prompts;
  for (const auto& r : rows) {
    ASSERT_FALSE(r.contains("infeasible")) << r.dump();
    prompts[r["gpus"].get<int>()].push_back(r["prompts"].get<int64_t>());
    if (r["gpus"] == 1) {
      EXPECT_NEAR(r["efficiency"].get<double>(), 1.0, 1e-12) << "one GPU is its own ceiling";
    }
    // At most 1, but for rank 0's Euler time: one GPU pays it between steps, a ring whose rank 0 only
    // coordinates hides it behind the stages.
    EXPECT_LE(r["efficiency"].get<double>(), 1.001) << r.dump();
    EXPECT_LE(r["stages"].get<int>(), 57) << "a ring has at most one stage per block";
  }
  EXPECT_EQ(prompts.size(), 8u) << "1, 2, 3, 4, 8, 16, 32, 64 GPUs";
  EXPECT_EQ(prompts[1], (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(prompts[3], (std::vector<int64_t>{1, 3, 12}));
  EXPECT_EQ(prompts[64], (std::vector<int64_t>{1, 64, 256}));
  // The table form.
  const auto text = plan("--world-size 2 --simulate-sweep --link nvlink");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("simulated sweep"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("slowest stage ms"), std::string::npos) << text.output;
}

TEST(PlanSimulate, StageTimesCanBeReplacedAndBadInputsFailClearly) {
  auto result = plan("--world-size 2 --device-map pipeline --simulate --prompts 2 --stage-ms 50,10 --json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto map = nlohmann::json::parse(result.output)["simulation"]["maps"][0];
  EXPECT_EQ(map["stage_times_from"], "--stage-ms");
  EXPECT_EQ(map["stage_ms"], (std::vector<double>{50, 10}));
  EXPECT_NEAR(map["runs"][0]["stages"][0]["busy_fraction"].get<double>(), 1.0, 0.05) << "the slow stage is the pace";

  result = plan("--world-size 2 --device-map pipeline --simulate --stage-ms 1,2,3");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("--stage-ms gives 3 stage time(s) but the map 'pipeline' has 2"), std::string::npos)
      << result.output;
  result = plan("--world-size 2 --simulate --stage-ms 1,fast");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("'fast' is not a non-negative number"), std::string::npos) << result.output;
  result = plan("--world-size 2 --simulate --link infiniband");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("not a link preset (nvlink, pcie, ib)"), std::string::npos) << result.output;
  result = plan("--world-size 2 --simulate-sweep --stage-ms 1,2");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("do not go together"), std::string::npos) << result.output;
  for (const char* bad : {"--prompts 0", "--microbatch-size 0", "--images-per-prompt 0", "--steps 0"}) {
    result = plan(std::string("--world-size 2 --simulate ") + bad);
    EXPECT_EQ(result.exit_code, 3) << bad << "\n" << result.output;
    EXPECT_NE(result.output.find("must be at least 1, got 0"), std::string::npos) << bad << "\n" << result.output;
  }
  result = plan("--world-size 2 --simulate --link-gbps 0");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("link bandwidth must be positive"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace dp::placement
