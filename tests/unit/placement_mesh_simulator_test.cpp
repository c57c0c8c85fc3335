// The ring simulator on a mesh of stage groups x sequence-parallel ranks (placement/mesh_simulation.h): the
// event replay of a 2 x 2 mesh and a 1 x 4 one against timelines worked out by hand, Ulysses' all-to-all bytes
// and the per-rank FLOP split against the issue's formulas, the link of a group that crosses nodes, the sweep's
// choice against a hand computation, and `plan --sequence-parallel / --simulate-sweep` end to end (invalid K
// refused first, K = 1 unchanged).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "models/flux/flux_config.h"
#include "placement/flux_module_tree.h"
#include "placement/mesh_simulation.h"
#include "placement/ring_simulator.h"
#include "placement/stage_timing.h"
#include "test_support.h"

namespace dp::placement {
namespace {

// 1 GB/s and no latency: a million bytes take exactly 1 ms.
LinkModel one_gb_per_s(double latency_us = 0) { return {"test", 1.0, latency_us}; }

// Two stage groups of two ranks, rank 0 computing in group 0 (ranks 0-1), group 1 on ranks 2-3. Per rank:
// prompts 1 MB (1 ms), step inputs 0.5 MB, activations 3 MB, noise 0.25 MB; group 0 does 4 all-to-alls of
// 2 MB in all per step over a 1 GB/s link with 10 us each (2.04 ms), group 1 six of 3 MB (3.06 ms).
RingSimulationInput two_by_two() {
  RingSimulationInput in;
  in.sequence_parallel = 2;
  in.stage_ranks = {0, 2};
  in.stage_ms = {10.0, 8.0};
  in.prompt_bytes_per_image = 1'000'000;
  in.step_input_bytes_per_image = 500'000;
  in.activation_bytes_per_image = 3'000'000;
  in.noise_bytes_per_image = 250'000;
  in.link = one_gb_per_s();
  in.stage_exchanges = {{4, 2'000'000, one_gb_per_s(10)}, {6, 3'000'000, one_gb_per_s(10)}};
  in.euler_ms = 0.5;
  in.images = 1;
  in.steps = 2;
  return in;
}

TEST(MeshSimulator, TwoByTwoOneImageFollowsTheHandTimeline) {
  // Rank 0 sends the prompt shard to rank 1 (0 -> 1 ms). Each step: the step input shard to rank 1 (0.5 ms,
  // behind the prompt on that link for step 0), group 0 computes 10 ms and exchanges 2.04 ms, each rank sends
  // its 3 MB shard to its partner in group 1 (3 ms, links side by side), group 1 computes 8 ms and exchanges
  // 3.06 ms, both noise shards come back to rank 0 one after the other (0.5 ms), Euler 0.5 ms.
  //   step 0: 1.0 + 0.5 + 10 + 2.04 + 3 + 8 + 3.06 + 0.5 + 0.5 = 28.60
  //   step 1: 28.60 + 0.5 + 10 + 2.04 + 3 + 8 + 3.06 + 0.5 + 0.5 = 56.20
  const auto sim = simulate_ring(two_by_two());
  EXPECT_EQ(sim.sequence_parallel, 2);
  EXPECT_NEAR(sim.total_ms, 56.20, 1e-9);
  ASSERT_EQ(sim.stages.size(), 2u);
  EXPECT_NEAR(sim.stages[0].compute_ms, 20.0, 1e-9);
  EXPECT_NEAR(sim.stages[0].all_to_all_ms, 4.08, 1e-9);
  EXPECT_EQ(sim.stages[0].all_to_all_bytes_per_step, 2'000'000);
  EXPECT_NEAR(sim.stages[1].all_to_all_ms, 6.12, 1e-9);
  EXPECT_NEAR(sim.stages[1].busy_fraction, (16.0 + 6.12) / 56.20, 1e-12);
  EXPECT_NEAR(sim.bubble_fraction, 1.0 - (24.08 + 22.12) / (2 * 56.20), 1e-12);
  EXPECT_NEAR(sim.coordinator_busy_fraction, (1.0 + 24.08) / 56.20, 1e-12);

  ASSERT_EQ(sim.links.size(), 3u);
  // Rank 0's scatter to the rest of its group: rank 1 only, one shard per message.
  EXPECT_EQ(sim.links[0].from_rank, 0);
  EXPECT_EQ(sim.links[0].to_rank, 1);
  EXPECT_EQ(sim.links[0].peers, 1);
  EXPECT_EQ(sim.links[0].bytes_per_step, 500'000);
  EXPECT_EQ(sim.links[0].bytes_total, 1'000'000 + 2 * 500'000);
  // (0, k) -> (1, k): two links, each with one rank's shard.
  EXPECT_EQ(sim.links[1].from_rank, 0);
  EXPECT_EQ(sim.links[1].to_rank, 2);
  EXPECT_EQ(sim.links[1].parallel, 2);
  EXPECT_EQ(sim.links[1].bytes_per_step, 3'000'000);
  // Both shards of group 1's noise into rank 0.
  EXPECT_EQ(sim.links[2].from_rank, 2);
  EXPECT_EQ(sim.links[2].to_rank, 0);
  EXPECT_EQ(sim.links[2].peers, 2);
  EXPECT_EQ(sim.links[2].bytes_per_step, 500'000);

  const auto json = to_json(sim);
  EXPECT_EQ(json["sequence_parallel"], 2);
  EXPECT_EQ(json["links"][1]["parallel_links"], 2);
  EXPECT_EQ(json["stages"][1]["group_ranks"], (std::vector<int>{2, 3}));
}

TEST(MeshSimulator, TwoMicrobatchesOverlapAsWorkedOutByHand) {
  // Two images, one step. Both prompt shards go first (link 0 busy to 2.0). m0: step input 2.0 -> 2.5, group 0
  // to 14.54 (rank 0's clock), shards 14.54 -> 17.54, group 1 to 28.60, noise 29.10. m1 enters at 14.54: its
  // input 15.04, group 0 to 27.08, shards 27.08 -> 30.08, group 1 to 41.14, noise 41.64. Euler updates at 29.10
  // -> 29.60 and 41.64 -> 42.14.
  auto in = two_by_two();
  in.images = 2;
  in.steps = 1;
  const auto sim = simulate_ring(in);
  EXPECT_EQ(sim.microbatches, 2);
  EXPECT_NEAR(sim.total_ms, 42.14, 1e-9);
  EXPECT_NEAR(sim.images_per_s, 2 / 42.14e-3, 1e-9);
  EXPECT_EQ(sim.links[0].bytes_total, 2 * 1'000'000 + 2 * 500'000);
  EXPECT_EQ(sim.stages[0].all_to_all_bytes_per_step, 2 * 2'000'000) << "one step of every microbatch";
}

TEST(MeshSimulator, OneGroupOfFourOnRankZeroAndAGroupWithoutIt) {
  // 1 x 4: rank 0 scatters three shards (0.5 MB each) and gathers three noise shards (0.25 MB each); a step
  // is 1.5 + 10 + 2.04 + 0.75 + 0.5 Euler = 14.79 ms after the three prompt shards (3 ms).
  RingSimulationInput in = two_by_two();
  in.sequence_parallel = 4;
  in.stage_ranks = {0};
  in.stage_ms = {10.0};
  in.stage_exchanges = {{4, 2'000'000, one_gb_per_s(10)}};
  in.steps = 3;
  auto sim = simulate_ring(in);
  EXPECT_NEAR(sim.total_ms, 3.0 + 3 * 14.79, 1e-9);
  ASSERT_EQ(sim.links.size(), 2u);
  EXPECT_EQ(sim.links[0].to_rank, 1);
  EXPECT_EQ(sim.links[0].peers, 3);
  EXPECT_EQ(sim.links[0].bytes_per_step, 3 * 500'000);
  EXPECT_EQ(sim.links[1].from_rank, 1);
  EXPECT_EQ(sim.links[1].to_rank, 0);
  EXPECT_EQ(sim.links[1].bytes_per_step, 3 * 250'000);
  // The same group on ranks 4-7 (group 0 holds no stage): rank 0 sends and receives all four shards.
  in.stage_ranks = {4};
  sim = simulate_ring(in);
  EXPECT_NEAR(sim.total_ms, 4.0 + 3 * (2.0 + 10 + 2.04 + 1.0 + 0.5), 1e-9);
  EXPECT_EQ(sim.links[0].peers, 4);
  EXPECT_EQ(sim.links[1].bytes_per_step, 4 * 250'000);
}

TEST(MeshSimulator, RefusesAStageThatIsNotTheStartOfAGroup) {
  auto in = two_by_two();
  in.stage_ranks = {0, 3};
  try {
    simulate_ring(in);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not the first rank of a group of 2"), std::string::npos) << e.what();
  }
  in = two_by_two();
  in.stage_exchanges.pop_back();
  EXPECT_THROW(simulate_ring(in), Error);
}

TEST(MeshSimulator, UlyssesBytesAreTheIssuesFormula) {
  // Each rank sends (K - 1)/K of its shard: q, k, v in (3 x L/K x D), the output back (1 x L/K x D).
  const auto dev = models::FluxConfig::flux_dev();
  const int64_t d = 3072, tokens = 4096 + 512, bf16 = 2;
  for (int k : {2, 4, 8}) {
    const auto bytes = ulysses_bytes_per_block(dev, 1024, 1024, 512, io::DType::BF16, k);
    EXPECT_EQ(bytes.qkv, 3 * (tokens / k) * d * (k - 1) / k * bf16) << "K = " << k;
    EXPECT_EQ(bytes.out, 1 * (tokens / k) * d * (k - 1) / k * bf16) << "K = " << k;
  }
  EXPECT_EQ(ulysses_bytes_per_block(dev, 1024, 1024, 512, io::DType::BF16, 2).per_block(), 28'311'552);
  // Uneven shards: 4096 image and 512 text tokens over 3 ranks, the longest shard 1366 + 171 tokens.
  EXPECT_EQ(ulysses_bytes_per_block(dev, 1024, 1024, 512, io::DType::BF16, 3).qkv, 3 * (1366 + 171) * 1024 * 2 * bf16);
  EXPECT_EQ(ulysses_bytes_per_block(dev, 1024, 1024, 512, io::DType::BF16, 1).per_block(), 0);
  EXPECT_THROW(ulysses_bytes_per_block(dev, 1024, 1024, 512, io::DType::BF16, 5), Error);
  // 768x1360: 4080 image tokens.
  EXPECT_EQ(ulysses_bytes_per_block(dev, 768, 1360, 512, io::DType::BF16, 2).per_block(),
            4 * (4080 + 512) / 2 * d / 2 * bf16);
}

TEST(MeshSimulator, ARankDoesItsShareOfTheBlocksFlops) {
  // The linear layers follow the rank's tokens, attention its heads (1/K), the modulation stays whole.
  const auto dev = models::FluxConfig::flux_dev();
  const double d = 3072, length = 4608;
  const double attention = 4 * length * length * d;
  // K = 1 is the one-GPU count stage_timing always made: 24 d^2 per token, 4 L^2 d, the modulation on temb.
  EXPECT_DOUBLE_EQ(double_block_flops(dev, 1024, 1024, 512), 24 * d * d * length + attention + 2 * 12 * d * d);
  EXPECT_DOUBLE_EQ(single_block_flops(dev, 1024, 1024, 512, 1), 24 * d * d * length + attention + 2 * 3 * d * d);
  using BlockFlops = double (*)(const models::FluxConfig&, int64_t, int64_t, int64_t, int);
  const std::vector<std::pair<double, BlockFlops>> kinds = {{2 * 12 * d * d, &double_block_flops},
                                                             {2 * 3 * d * d, &single_block_flops}};
  for (const auto& [modulation, flops] : kinds) {
    const double whole = flops(dev, 1024, 1024, 512, 1);
    for (int k : {2, 4, 8})  // even shards: everything but the modulation splits exactly
      EXPECT_NEAR(flops(dev, 1024, 1024, 512, k), (whole - modulation) / k + modulation, 1e-6 * whole) << k;
    // K = 3: the linear part on the longest shard, 1537 of 4608 tokens.
    const double linear = whole - modulation - attention;
    EXPECT_NEAR(flops(dev, 1024, 1024, 512, 3), linear * 1537 / 4608 + attention / 3 + modulation, 1e-6 * whole);
  }
  // Measured block times calibrate ms per FLOP on one GPU; a rank's block takes its share of it.
  TimingModel timing;
  timing.double_block_ms = 3.0;
  timing.single_block_ms = 2.8;
  timing.sequence_parallel = 2;
  const auto units = flux_timed_units(dev, flux_module_tree(dev, io::DType::BF16), timing);
  EXPECT_NEAR(units[1].ms, 3.0 * double_block_flops(dev, 1024, 1024, 512, 2) / double_block_flops(dev, 1024, 1024, 512),
              1e-9);
  EXPECT_GT(units[1].bytes, 0) << "every rank of the group holds the whole block";
}

TEST(MeshSimulator, AGroupAcrossNodesSendsItsCrossNodeShareOverInfiniBand) {
  const LinkModel nvlink = link_preset("nvlink");
  // Inside one node of 8: the link itself.
  auto link = all_to_all_link(nvlink, {1, 8}, 0, 8);
  EXPECT_EQ(link.name, "nvlink");
  EXPECT_DOUBLE_EQ(link.gb_per_s, 450.0);
  // 8 ranks over two nodes of 4: a rank has 3 peers over NVLink and 4 over IB (25 GB/s), in parallel; the IB
  // side takes 4/25 of the time per GB-per-peer, so 7 peers' bytes cross at 7 / (4 / 25) = 43.75 GB/s.
  link = all_to_all_link(nvlink, {1, 8}, 0, 4);
  EXPECT_EQ(link.name, "nvlink+ib");
  EXPECT_NEAR(link.gb_per_s, 43.75, 1e-12);
  EXPECT_DOUBLE_EQ(link.latency_us, 3.0);
  // Groups of 3 on nodes of 4: group 1 is ranks 3 | 4, 5; rank 3 reaches both peers over IB: 2 / (2 / 25).
  link = all_to_all_link(nvlink, {2, 3}, 1, 4);
  EXPECT_NEAR(link.gb_per_s, 25.0, 1e-12);
  EXPECT_EQ(all_to_all_link(nvlink, {2, 3}, 0, 4).name, "nvlink") << "ranks 0-2 share node 0";
  // Over "ib" every message leaves through the GPU's one port anyway.
  EXPECT_DOUBLE_EQ(all_to_all_link(link_preset("ib"), {1, 8}, 0, 4).gb_per_s, 25.0);
}

// Three meshes of 4 GPUs for a transformer that takes 40 ms a step on one GPU, over free ring links: S x K
// ranks each compute 40 / (S x K) ms, and a group of K > 1 spends `exchange_ms` per step in all-to-alls.
std::vector<MeshCandidate> meshes_of_four(double exchange_ms) {
  std::vector<MeshCandidate> out;
  for (int k : {1, 2, 4}) {
    MeshCandidate c;
    c.mesh = {4 / k, k};
    c.ring.sequence_parallel = k;
    for (int g = 0; g < 4 / k; ++g) {
      c.ring.stage_ranks.push_back(g * k);
      c.ring.stage_ms.push_back(10.0);
      if (k > 1) c.ring.stage_exchanges.push_back({1, static_cast<int64_t>(exchange_ms * 1e6), one_gb_per_s()});
    }
    c.ring.link = one_gb_per_s();
    c.ring.euler_ms = 0;
    c.ring.steps = 10;
    out.push_back(c);
  }
  return out;
}

TEST(MeshSimulator, TheSweepPicksTheMeshTheHandComputationSays) {
  RingSimulationInput one_gpu;
  one_gpu.stage_ranks = {0};
  one_gpu.stage_ms = {40.0};
  one_gpu.link = one_gb_per_s();
  one_gpu.euler_ms = 0;
  one_gpu.steps = 10;
  // With 1 ms of all-to-all per step, 10 steps, 1 image and 8:
  //   4 x 1: latency 10 x 4 x 10 = 400 ms; 8 images fill 4 stages: (8 x 10 + 3) x 10 = 830 ms
  //   2 x 2: stages of 11 ms: 10 x 2 x 11 = 220 ms; (80 + 1) x 11 = 891 ms
  //   1 x 4: 10 x 11 = 110 ms; 80 x 11 = 880 ms
  auto sweep = sweep_meshes(meshes_of_four(1.0), one_gpu, 1, 8);
  ASSERT_EQ(sweep.rows.size(), 3u);
  EXPECT_NEAR(sweep.rows[0].latency_s, 0.400, 1e-12);
  EXPECT_NEAR(sweep.rows[1].latency_s, 0.220, 1e-12);
  EXPECT_NEAR(sweep.rows[2].latency_s, 0.110, 1e-12);
  EXPECT_NEAR(sweep.rows[0].throughput.images_per_s, 8 / 0.830, 1e-9);
  EXPECT_NEAR(sweep.rows[1].throughput.images_per_s, 8 / 0.891, 1e-9);
  EXPECT_NEAR(sweep.rows[2].throughput.images_per_s, 8 / 0.880, 1e-9);
  EXPECT_NEAR(sweep.one_gpu_images_per_s, 8 / 3.2, 1e-9);
  EXPECT_NEAR(sweep.rows[0].efficiency, (8 / 0.830) / (4 * 8 / 3.2), 1e-9);
  EXPECT_NEAR(sweep.rows[1].rank_step_ms, 11.0, 1e-9);
  EXPECT_NEAR(sweep.rows[1].all_to_all_ms_per_step, 1.0, 1e-9);
  EXPECT_EQ(sweep.best_latency, 2) << "one image: the most sequence parallelism";
  EXPECT_EQ(sweep.best_throughput, 0) << "many images: stages, which exchange nothing";

  // GPUs too small for the whole transformer: 1 x 4 cannot run, and 2 x 2 is the fastest for one image.
  auto candidates = meshes_of_four(1.0);
  candidates[2].excluded = "out of memory";
  sweep = sweep_meshes(candidates, one_gpu, 1, 8);
  EXPECT_EQ(sweep.best_latency, 1);
  EXPECT_EQ(sweep.best_throughput, 0);
  EXPECT_EQ(to_json(sweep)["rows"][2]["excluded"], "out of memory");
  EXPECT_EQ(to_json(sweep)["best_latency"]["sequence_parallel"], 2);

  // All-to-alls as slow as the compute (40 ms a step): 1 x 4 takes 10 x 50 = 500 ms, 2 x 2 10 x 2 x 50 =
  // 1000 ms, so stages win for one image too.
  sweep = sweep_meshes(meshes_of_four(40.0), one_gpu, 1, 8);
  EXPECT_NEAR(sweep.rows[2].latency_s, 0.500, 1e-12);
  EXPECT_EQ(sweep.best_latency, 0);
}

// --- `diffpipe plan` with --sequence-parallel and --simulate-sweep ---

std::string flux_dev_folder() {
  static const std::string dir = [] {
    const std::string d = dp::test::temp_dir("mesh-simulator-flux-dev") + "/flux-dev";
    const auto made = dp::test::run_command(dp::test::diffpipe_binary() + " make-random --arch flux-dev --sparse --out " + d);
    EXPECT_EQ(made.exit_code, 0) << made.output;
    return d;
  }();
  return dir;
}

dp::test::CommandResult plan(const std::string& arguments) {
  return dp::test::run_command(dp::test::diffpipe_binary() + " plan --model " + flux_dev_folder() + " " + arguments);
}

TEST(PlanMesh, AnInvalidSequenceParallelIsTheOneErrorNamingValidValues) {
  // Refused before anything else: the bad --dtype and --link after it are never reached.
  auto result = plan("--world-size 4 --sequence-parallel 3 --dtype bogus --simulate --link nowhere");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("--sequence-parallel 3 does not divide the world of 4"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("valid values: 1, 2, 4"), std::string::npos) << result.output;
  result = plan("--world-size 10 --sequence-parallel 5 --dtype bogus");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("24 attention heads"), std::string::npos) << result.output;
  // 3, 4, 6 and 8 would split the heads but not the world of 10: only the values that divide both are offered.
  EXPECT_NE(result.output.find("world of 10 rank(s): 1, 2 ["), std::string::npos) << result.output;
  result = plan("--world-size 8 --sequence-parallel 8 --height 32 --width 32");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("leaves a rank without tokens"), std::string::npos) << result.output;
  EXPECT_EQ(plan("--world-size 4 --sequence-parallel 0").exit_code, 3);
}

TEST(PlanMesh, KOneIsTodaysOutput) {
  const std::string args = "--world-size 2 --device-map pipeline --block-times 3.07,2.85 --simulate --link pcie";
  const auto today = plan(args + " 2>&1");
  const auto with_k1 = plan(args + " --sequence-parallel 1 2>&1");
  ASSERT_EQ(today.exit_code, 0) << today.output;
  EXPECT_EQ(with_k1.output, today.output);
  EXPECT_EQ(today.output.find("a2a"), std::string::npos) << "no mesh columns with K = 1";
  EXPECT_EQ(today.output.find("mesh:"), std::string::npos);
}

TEST(PlanMesh, SimulateTwoStageGroupsOfTwo) {
  auto result = plan("--world-size 4 --sequence-parallel 2 --device-map pipeline --simulate --prompts 4 --json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto json = nlohmann::json::parse(result.output);
  EXPECT_EQ(json["world_size"], 2) << "the plan is made for the two stage groups";
  EXPECT_EQ(json["mesh"]["world_size"], 4);
  EXPECT_EQ(json["mesh"]["sequence_parallel"], 2);
  const auto& sim = json["simulation"];
  EXPECT_EQ(sim["sequence_parallel"], 2);
  EXPECT_EQ(sim["all_to_all_bytes_per_block_per_rank"]["qkv"], 3 * 2304 * 1536 * 2);
  // Shards between stage groups: image and text tokens halved, temb whole.
  EXPECT_EQ(sim["message_bytes_per_image"]["activations"], 2 * (2048 + 256 + 1) * 3072);
  const auto& map = sim["maps"][0];
  EXPECT_EQ(map["ranks"], 4);
  EXPECT_EQ(map["stage_groups"], 2);
  int64_t blocks = 0;
  for (const auto& a : map["all_to_all"]) {
    EXPECT_EQ(a["bytes_per_step_per_rank"], a["blocks"].get<int64_t>() * 28'311'552) << a;
    EXPECT_EQ(a["all_to_alls_per_step"], 2 * a["blocks"].get<int64_t>());
    EXPECT_EQ(a["link"]["name"], "nvlink");
    blocks += a["blocks"].get<int64_t>();
  }
  EXPECT_EQ(blocks, 57);
  const auto& run = map["runs"][0];
  EXPECT_EQ(run["links"][1]["from_rank"], 0);
  EXPECT_EQ(run["links"][1]["to_rank"], 2);
  EXPECT_EQ(run["links"][1]["parallel_links"], 2);
  EXPECT_LE(run["efficiency"].get<double>(), 1.0);
  EXPECT_GT(run["efficiency"].get<double>(), 0.8);

  // Measured rank times (--stage-ms) are compared with one GPU scaled as much from the plan: a rank twice as
  // fast as planned meets a GPU twice as fast.
  const auto planned_ms = map["stage_ms"].get<std::vector<double>>();
  const std::string halved = std::to_string(planned_ms[0] / 2) + "," + std::to_string(planned_ms[1] / 2);
  const std::string no_euler = "--world-size 4 --sequence-parallel 2 --device-map pipeline --simulate --prompts 4 "
                               "--euler-ms 0 --json 2>/dev/null";
  result = plan(no_euler);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto planned = nlohmann::json::parse(result.output)["simulation"]["maps"][0]["runs"][0];
  result = plan(no_euler + " --stage-ms " + halved);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto measured = nlohmann::json::parse(result.output)["simulation"]["maps"][0]["runs"][0];
  EXPECT_NEAR(measured["one_gpu_images_per_s"].get<double>(), 2 * planned["one_gpu_images_per_s"].get<double>(),
              1e-5 * measured["one_gpu_images_per_s"].get<double>());
  EXPECT_LE(measured["efficiency"].get<double>(), 1.0);

  result = plan("--world-size 4 --sequence-parallel 2 --device-map pipeline --simulate");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* text : {"mesh: 4 ranks = 2 pipeline stage group(s) x 2", "launch with mpirun -np 4 and --sequence-parallel 2",
                           "group 1 (ranks 2-3)", "a2a/step/rank", "all-to-all per step and rank: group 0", "0->2 x2",
                           "2-3->0"})
    EXPECT_NE(result.output.find(text), std::string::npos) << "missing '" << text << "' in\n" << result.output;
}

TEST(PlanMesh, SweepMarksTheBestMeshWithinTheMemory) {
  // 4 GPUs of 16 GB: the whole transformer (23.8 GB) fits no GPU, so 1 x 4 is out; 2 x 2 halves a rank's
  // compute against 4 x 1's sequential ring for one image: the best latency, at about half of 4 x 1's.
  auto result = plan("--world-size 4 --gpu-memory 16GB --simulate-sweep --prompts 16 --json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto sweep = nlohmann::json::parse(result.output)["mesh_sweep"];
  ASSERT_EQ(sweep["rows"].size(), 3u);
  EXPECT_EQ(sweep["rows"][0]["stages"], 4);
  EXPECT_EQ(sweep["rows"][2]["sequence_parallel"], 4);
  EXPECT_NE(sweep["rows"][2]["excluded"].get<std::string>().find("out of memory"), std::string::npos) << sweep["rows"][2];
  EXPECT_EQ(sweep["best_latency"]["sequence_parallel"], 2);
  const double ratio = sweep["rows"][1]["latency_s"].get<double>() / sweep["rows"][0]["latency_s"].get<double>();
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 0.56);
  EXPECT_EQ(sweep["throughput_images"], 16);
  EXPECT_LE(sweep["rows"][1]["weights_bytes_per_gpu"].get<int64_t>(), 16'000'000'000);
  // Ten GPUs: K = 5 and 10 do not divide FLUX's 24 heads.
  result = plan("--world-size 10 --simulate-sweep --prompts 1 --json 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto ten = nlohmann::json::parse(result.output)["mesh_sweep"];
  ASSERT_EQ(ten["rows"].size(), 4u);
  EXPECT_NE(ten["rows"][2]["excluded"].get<std::string>().find("does not divide the 24 attention heads"),
            std::string::npos);
  EXPECT_EQ(ten["best_latency"]["sequence_parallel"], 2) << "10 = 5 x 2 is the widest valid group";
  // The table.
  result = plan("--world-size 4 --gpu-memory 16GB --simulate-sweep");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("simulated meshes of 4 GPU(s) of 16.00 GB each"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("<- best latency"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("<- best throughput"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace dp::placement
