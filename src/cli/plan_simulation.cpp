#include "cli/plan_simulation.h"

#include <algorithm>
#include <set>

#include "cli/format.h"
#include "core/error.h"
#include "placement/flux_module_tree.h"
#include "placement/mesh.h"
#include "placement/mesh_simulation.h"
#include "placement/ring_simulator.h"

namespace dp::cli {

std::string ring_text(const nlohmann::ordered_json& ranks) {
  std::string text = ranks["ring"][0]["rank"].get<int>() == 0 ? "" : "rank 0";
  for (const auto& s : ranks["ring"])
    text += str(text.empty() ? "" : " -> ", s["text"].get<std::string>());
  return text + " -> rank 0";
}

namespace {

// What every simulation of one mesh shares: the transformer, one rank's unit times per microbatch and message
// sizes, the links and the workload.
struct SimulationContext {
  models::FluxConfig config;
  std::vector<placement::TimedUnit> units;
  placement::RingMessageBytes bytes;
  placement::LinkModel link;
  bool overlap = true;
  int64_t microbatch_size = 1;
  int64_t images_per_prompt = 1;
  int steps = 28;
  double euler_ms = 0.1;
  int max_in_flight = 0;
  // The mesh (K > 1 only): one rank's all-to-all bytes per block, and one GPU's step for the efficiency ceiling.
  int sequence_parallel = 1;
  int gpus_per_node = 8;
  placement::UlyssesBytes exchange;
  double one_gpu_step_ms = 0;
};

SimulationContext simulation_context(const placement::PlanRequest& request, const SimulationOptions& o,
                                     const models::FluxConfig& config, int sequence_parallel) {
  SimulationContext c;
  c.config = config;
  placement::TimingModel timing = request.timing;
  timing.sequence_parallel = sequence_parallel;
  const auto tree = placement::flux_module_tree(c.config, request.dtype);
  c.units = placement::flux_timed_units(c.config, tree, timing);
  c.bytes = placement::flux_ring_message_bytes(c.config, timing.height, timing.width, timing.text_tokens, request.dtype,
                                               sequence_parallel);
  c.link = placement::link_preset(o.link);
  if (!std::isnan(o.link_gbps) || !std::isnan(o.link_latency_us)) c.link.name = "custom";
  if (!std::isnan(o.link_gbps)) c.link.gb_per_s = o.link_gbps;
  if (!std::isnan(o.link_latency_us)) c.link.latency_us = o.link_latency_us;
  c.overlap = !o.no_overlap;
  c.microbatch_size = timing.batch;
  c.images_per_prompt = o.images_per_prompt;
  c.steps = o.steps;
  c.euler_ms = o.euler_ms;
  c.max_in_flight = o.max_in_flight;
  c.sequence_parallel = sequence_parallel;
  c.gpus_per_node = o.gpus_per_node;
  if (sequence_parallel > 1) {
    c.exchange = placement::ulysses_bytes_per_block(c.config, timing.height, timing.width, timing.text_tokens,
                                                    request.dtype, sequence_parallel);
    timing.sequence_parallel = 1;
    for (const auto& u : placement::flux_timed_units(c.config, tree, timing)) c.one_gpu_step_ms += u.ms;
  }
  return c;
}

// The ring of `stages` (map_ranks' stages: a stage's rank is its stage group with K > 1).
placement::RingSimulationInput ring_input(const SimulationContext& c, const std::vector<placement::RankStage>& stages,
                                          const std::vector<double>& stage_ms, int64_t images) {
  placement::RingSimulationInput in;
  for (const auto& s : stages) in.stage_ranks.push_back(s.rank * c.sequence_parallel);
  in.stage_ms = stage_ms;
  in.prompt_bytes_per_image = c.bytes.prompts;
  in.step_input_bytes_per_image = c.bytes.step_inputs;
  in.activation_bytes_per_image = c.bytes.activations;
  in.noise_bytes_per_image = c.bytes.noise;
  in.link = c.link;
  in.transfers_overlap_compute = c.overlap;
  in.images = images;
  in.microbatch_size = c.microbatch_size;
  in.steps = c.steps;
  in.euler_ms = c.euler_ms;
  in.max_in_flight = c.max_in_flight;
  if (c.sequence_parallel > 1) {
    const placement::MeshShape mesh{static_cast<int>(stages.back().rank) + 1, c.sequence_parallel};
    in.sequence_parallel = c.sequence_parallel;
    in.stage_exchanges = placement::flux_stage_exchanges(c.exchange, stages, mesh, c.link, c.gpus_per_node);
  }
  return in;
}

placement::RingSimulation simulate(const SimulationContext& c, const std::vector<placement::RankStage>& stages,
                                   const std::vector<double>& stage_ms, int64_t images) {
  return placement::simulate_ring(ring_input(c, stages, stage_ms, images));
}

// One GPU holding every block: the ceiling a world of N is measured against (N times its images/s). With
// K = 1 the sum of the stages given (planned or --stage-ms); with K > 1 stage times are one rank's, and the
// ceiling is the whole transformer's planned time on one GPU, scaled by `given_over_planned` (the stage times
// given with --stage-ms over the planned ones, so that measured ranks are compared with a GPU as fast).
placement::RingSimulationInput one_gpu_input(const SimulationContext& c, const std::vector<double>& stage_ms,
                                             int64_t images, double given_over_planned = 1.0) {
  double sum = 0;
  for (double ms : stage_ms) sum += ms;
  SimulationContext one = c;
  one.sequence_parallel = 1;
  return ring_input(one, {{0, 0, c.config.num_blocks()}},
                    {c.sequence_parallel > 1 ? c.one_gpu_step_ms * given_over_planned : sum}, images);
}

nlohmann::ordered_json simulated_run(const SimulationContext& c, const placement::MapRanks& ranks,
                                     const std::vector<double>& stage_ms, int64_t prompts,
                                     double given_over_planned = 1.0) {
  const int64_t images = prompts * c.images_per_prompt;
  const auto sim = simulate(c, ranks.stages, stage_ms, images);
  const double ceiling =
      placement::simulate_ring(one_gpu_input(c, stage_ms, images, given_over_planned)).images_per_s;
  nlohmann::ordered_json run = {{"prompts", prompts}, {"images", images}};
  run.update(placement::to_json(sim));
  run["one_gpu_images_per_s"] = ceiling;
  run["efficiency"] = ceiling > 0 ? sim.images_per_s / (ranks.ranks * c.sequence_parallel * ceiling) : 0.0;
  return run;
}

// 1, N and 4N prompts for a world of N, unless --prompts names one count (asked > 0).
std::vector<int64_t> prompt_counts(int64_t asked, int world) {
  if (asked > 0) return {asked};
  const std::set<int64_t> counts = {1, world, 4 * static_cast<int64_t>(world)};
  return {counts.begin(), counts.end()};
}

// Per ring stage of a mesh: one rank's all-to-alls in one step of one microbatch.
nlohmann::ordered_json all_to_all_json(const placement::RingSimulationInput& in, const std::vector<placement::RankStage>& stages) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < in.stage_exchanges.size(); ++i) {
    const auto& e = in.stage_exchanges[i];
    out.push_back({{"stage_group", stages[i].rank}, {"blocks", stages[i].last_block - stages[i].first_block},
                   {"all_to_alls_per_step", e.collectives},
                   {"bytes_per_step_per_rank", e.bytes_per_image * in.microbatch_size},
                   {"ms_per_step_per_rank", e.ms(in.microbatch_size)}, {"link", placement::to_json(e.link)}});
  }
  return out;
}

nlohmann::ordered_json simulate_map(const SimulationContext& c, const std::string& name,
                                    const nlohmann::ordered_json& hf_device_map, const std::vector<double>& override_ms,
                                    const std::vector<int64_t>& prompts) {
  const auto ranks = placement::map_ranks(hf_device_map, c.config);
  nlohmann::ordered_json out = {{"map", name}, {"ranks", ranks.ranks * c.sequence_parallel}};
  if (c.sequence_parallel > 1) out["stage_groups"] = ranks.ranks;
  if (!ranks.unsupported.empty()) {
    DP_CHECK(override_ms.empty(), "--stage-ms: the map '", name, "' cannot run as a ring: ", ranks.unsupported);
    out["unsupported"] = ranks.unsupported;
    return out;
  }
  std::vector<double> stage_ms = placement::flux_ring_stage_ms(c.units, ranks.stages);
  out["stage_times_from"] = override_ms.empty() ? "plan" : "--stage-ms";
  double given_over_planned = 1.0;
  if (!override_ms.empty()) {
    nlohmann::ordered_json ranks_json = placement::to_json(ranks);
    DP_CHECK(override_ms.size() == stage_ms.size(), "--stage-ms gives ", override_ms.size(),
             " stage time(s) but the map '", name, "' has ", stage_ms.size(), " ring stage(s): ", ring_text(ranks_json));
    double given = 0, planned = 0;
    for (size_t i = 0; i < stage_ms.size(); ++i) {
      given += override_ms[i];
      planned += stage_ms[i];
    }
    if (planned > 0 && given > 0) given_over_planned = given / planned;
    stage_ms = override_ms;
  }
  out["stage_ms"] = stage_ms;
  if (c.sequence_parallel > 1) out["all_to_all"] = all_to_all_json(ring_input(c, ranks.stages, stage_ms, 1), ranks.stages);
  out["latency_one_prompt_s"] = simulate(c, ranks.stages, stage_ms, c.images_per_prompt).total_ms * 1e-3;
  out["runs"] = nlohmann::ordered_json::array();
  for (int64_t m : prompts) out["runs"].push_back(simulated_run(c, ranks, stage_ms, m, given_over_planned));
  return out;
}

nlohmann::ordered_json simulation_settings(const SimulationContext& c, const placement::PlanRequest& request) {
  nlohmann::ordered_json out = {
      {"link", placement::to_json(c.link)}, {"transfers_overlap_compute", c.overlap}, {"steps", c.steps},
      {"resolution", std::to_string(request.timing.height) + "x" + std::to_string(request.timing.width)},
      {"microbatch_size", c.microbatch_size}, {"images_per_prompt", c.images_per_prompt},
      {"euler_ms_per_microbatch_step", c.euler_ms},
      {"max_in_flight", c.max_in_flight > 0 ? nlohmann::ordered_json(c.max_in_flight) : nlohmann::ordered_json("one per stage")},
      {"message_bytes_per_image", {{"prompts_once", c.bytes.prompts}, {"step_inputs", c.bytes.step_inputs},
                                   {"activations", c.bytes.activations}, {"noise", c.bytes.noise}}}};
  if (c.sequence_parallel > 1) {
    // Message sizes above are then one rank's shard.
    out["sequence_parallel"] = c.sequence_parallel;
    out["gpus_per_node"] = c.gpus_per_node;
    out["all_to_all_bytes_per_block_per_rank"] = {{"qkv", c.exchange.qkv}, {"out", c.exchange.out}};
  }
  return out;
}

}  // namespace

nlohmann::ordered_json simulate_plan(const placement::PlanRequest& request, const SimulationOptions& o,
                                     const models::FluxConfig& config, const nlohmann::ordered_json& plan) {
  const SimulationContext c = simulation_context(request, o, config, o.sequence_parallel);
  nlohmann::ordered_json out = simulation_settings(c, request);
  const auto prompts = prompt_counts(o.prompts, plan["world_size"].get<int>() * o.sequence_parallel);
  out["maps"] = nlohmann::ordered_json::array();
  const std::string requested = request.device_map;
  out["maps"].push_back(simulate_map(c, requested, plan["hf_device_map"], o.stage_ms, prompts));
  for (const char* name : {"balanced", "pipeline"}) {
    const auto& cmp = plan["comparison"][name];
    if (requested == name || !cmp.contains("hf_device_map")) continue;
    out["maps"].push_back(simulate_map(c, name, cmp["hf_device_map"], {}, prompts));
  }
  return out;
}

nlohmann::ordered_json simulate_sweep(const placement::PlanRequest& asked, const SimulationOptions& o,
                                      const models::FluxConfig& config, int world) {
  placement::PlanRequest one_per_stage = asked;
  one_per_stage.timing.sequence_parallel = 1;
  const SimulationContext c = simulation_context(one_per_stage, o, config, 1);
  nlohmann::ordered_json out = simulation_settings(c, one_per_stage);
  out["strategy"] = "pipeline";
  out["gpu_memory_bytes"] = asked.gpu_memory_bytes;
  out["rows"] = nlohmann::ordered_json::array();
  std::set<int> worlds = {1, 2, 4, 8, 16, 32, 64, world};
  for (int n : worlds) {
    placement::PlanRequest request = one_per_stage;
    request.world_size = n;
    request.device_map = "pipeline";
    request.max_memory.reset();
    request.pipeline_device_map.clear();
    nlohmann::ordered_json plan;
    try {
      plan = placement::make_plan(request);
    } catch (const Error& e) {
      out["rows"].push_back({{"gpus", n}, {"infeasible", e.what()}});
      continue;
    }
    const auto ranks = placement::map_ranks(plan["hf_device_map"], c.config);
    if (!ranks.unsupported.empty()) {
      out["rows"].push_back({{"gpus", n}, {"infeasible", ranks.unsupported}});
      continue;
    }
    const auto stage_ms = placement::flux_ring_stage_ms(c.units, ranks.stages);
    const double latency = simulate(c, ranks.stages, stage_ms, c.images_per_prompt).total_ms * 1e-3;
    double slowest = 0;
    for (double ms : stage_ms) slowest = std::max(slowest, ms);
    for (int64_t m : prompt_counts(0, n)) {
      const auto run = simulated_run(c, ranks, stage_ms, m);
      out["rows"].push_back({{"gpus", n}, {"ranks", ranks.ranks}, {"stages", ranks.stages.size()}, {"prompts", m},
                             {"images", run["images"]}, {"total_s", run["total_s"]},
                             {"images_per_s", run["images_per_s"]}, {"latency_one_prompt_s", latency},
                             {"bubble_fraction", run["bubble_fraction"]},
                             {"efficiency", run["images_per_s"].get<double>() /
                                                (n * run["one_gpu_images_per_s"].get<double>())},
                             {"one_gpu_images_per_s", run["one_gpu_images_per_s"]}, {"slowest_stage_ms", slowest}});
    }
  }
  return out;
}

nlohmann::ordered_json simulate_mesh_sweep(const placement::PlanRequest& asked, const SimulationOptions& o,
                                           const models::FluxConfig& config, int world) {
  const auto& timing = asked.timing;
  const auto limits = placement::flux_sequence_parallel_limits(config, timing.height, timing.width, timing.text_tokens);
  std::vector<placement::MeshCandidate> candidates;
  for (int k = 1; k <= world; ++k) {
    if (world % k != 0) continue;
    placement::MeshCandidate candidate;
    candidate.mesh = placement::mesh_for_world(world, k);
    if (limits.attention_heads % k != 0) {
      candidate.excluded = str("K = ", k, " does not divide the ", limits.attention_heads, " attention heads");
    } else if (limits.text_tokens < k || limits.image_tokens < k) {
      candidate.excluded = str("K = ", k, " leaves a rank without tokens (", limits.text_tokens, " text, ",
                               limits.image_tokens, " image)");
    }
    if (!candidate.excluded.empty()) {
      candidates.push_back(candidate);
      continue;
    }
    // The S stage groups planned as S GPUs of --gpu-memory, each holding one rank's activations (stage_timing.h).
    placement::PlanRequest request = asked;
    request.world_size = candidate.mesh.stages;
    request.device_map = "pipeline";
    request.max_memory.reset();
    request.pipeline_device_map.clear();
    request.timing.sequence_parallel = k;
    nlohmann::ordered_json plan;
    try {
      plan = placement::make_plan(request);
    } catch (const Error&) {
      candidate.excluded = str("out of memory: ", candidate.mesh.stages, " stage group(s) cannot hold the blocks in ",
                               human_bytes(static_cast<uint64_t>(asked.gpu_memory_bytes)), " per GPU");
      candidates.push_back(candidate);
      continue;
    }
    const auto ranks = placement::map_ranks(plan["hf_device_map"], config);
    if (!ranks.unsupported.empty()) {
      candidate.excluded = ranks.unsupported;
      candidates.push_back(candidate);
      continue;
    }
    for (const auto& d : plan["devices"])
      if (d["device"].is_number())
        candidate.weights_bytes_per_gpu = std::max(candidate.weights_bytes_per_gpu, d["weights_bytes"].get<int64_t>());
    const SimulationContext c = simulation_context(request, o, config, k);
    candidate.ring = ring_input(c, ranks.stages, placement::flux_ring_stage_ms(c.units, ranks.stages), 1);
    candidates.push_back(candidate);
  }
  const SimulationContext one = simulation_context(asked, o, config, 1);
  const auto full = placement::flux_ring_stage_ms(one.units, {{0, 0, config.num_blocks()}});
  const int64_t prompts = o.prompts > 0 ? o.prompts : 4 * static_cast<int64_t>(world);
  const auto sweep = placement::sweep_meshes(candidates, one_gpu_input(one, full, 1), o.images_per_prompt,
                                             prompts * o.images_per_prompt);
  nlohmann::ordered_json out = simulation_settings(one, asked);
  out["world_size"] = world;
  out["gpu_memory_bytes"] = asked.gpu_memory_bytes;
  out["gpus_per_node"] = o.gpus_per_node;
  out["prompts"] = prompts;
  out.update(placement::to_json(sweep));
  return out;
}

}  // namespace dp::cli
