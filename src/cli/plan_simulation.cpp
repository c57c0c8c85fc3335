#include "cli/plan_simulation.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
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
// ceiling is the whole transformer's planned time on one GPU.
placement::RingSimulationInput one_gpu_input(const SimulationContext& c, const std::vector<double>& stage_ms,
                                             int64_t images) {
  double sum = 0;
  for (double ms : stage_ms) sum += ms;
  SimulationContext one = c;
  one.sequence_parallel = 1;
  return ring_input(one, {{0, 0, c.config.num_blocks()}}, {c.sequence_parallel > 1 ? c.one_gpu_step_ms : sum}, images);
}

nlohmann::ordered_json simulated_run(const SimulationContext& c, const placement::MapRanks& ranks,
                                     const std::vector<double>& stage_ms, int64_t prompts) {
  const int64_t images = prompts * c.images_per_prompt;
  const auto sim = simulate(c, ranks.stages, stage_ms, images);
  const double ceiling = placement::simulate_ring(one_gpu_input(c, stage_ms, images)).images_per_s;
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
  if (!override_ms.empty()) {
    nlohmann::ordered_json ranks_json = placement::to_json(ranks);
    DP_CHECK(override_ms.size() == stage_ms.size(), "--stage-ms gives ", override_ms.size(),
             " stage time(s) but the map '", name, "' has ", stage_ms.size(), " ring stage(s): ", ring_text(ranks_json));
    stage_ms = override_ms;
  }
  out["stage_ms"] = stage_ms;
  if (c.sequence_parallel > 1) out["all_to_all"] = all_to_all_json(ring_input(c, ranks.stages, stage_ms, 1), ranks.stages);
  out["latency_one_prompt_s"] = simulate(c, ranks.stages, stage_ms, c.images_per_prompt).total_ms * 1e-3;
  out["runs"] = nlohmann::ordered_json::array();
  for (int64_t m : prompts) out["runs"].push_back(simulated_run(c, ranks, stage_ms, m));
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

namespace {

std::string percent(double fraction) {
  char text[16];
  std::snprintf(text, sizeof(text), "%.1f%%", 100.0 * fraction);
  return text;
}

void print_simulation_settings(const nlohmann::ordered_json& s) {
  const auto& link = s["link"];
  const auto& bytes = s["message_bytes_per_image"];
  char line[512];
  std::snprintf(line, sizeof(line),
                "  %d steps at %s, microbatches of %lld image(s), %lld image(s) per prompt; rank 0 spends %.2f ms per "
                "microbatch step (Euler update)\n  link %s: %.1f GB/s and %.1f us per message, one link per pair of "
                "ring neighbours; transfers %s compute; steps in flight: %s\n",
                s["steps"].get<int>(), s["resolution"].get<std::string>().c_str(),
                static_cast<long long>(s["microbatch_size"].get<int64_t>()),
                static_cast<long long>(s["images_per_prompt"].get<int64_t>()),
                s["euler_ms_per_microbatch_step"].get<double>(), link["name"].get<std::string>().c_str(),
                link["gb_per_s"].get<double>(), link["latency_us"].get<double>(),
                s["transfers_overlap_compute"].get<bool>() ? "overlap" : "do not overlap",
                s["max_in_flight"].is_string() ? "one per stage" : std::to_string(s["max_in_flight"].get<int>()).c_str());
  const bool mesh = s.contains("sequence_parallel");
  std::cout << line << "  messages per image" << (mesh ? " and rank (its token shard)" : "") << ": prompts "
            << human_bytes(bytes["prompts_once"].get<uint64_t>()) << " (once), step inputs "
            << human_bytes(bytes["step_inputs"].get<uint64_t>()) << ", activations "
            << human_bytes(bytes["activations"].get<uint64_t>()) << " per stage boundary, noise "
            << human_bytes(bytes["noise"].get<uint64_t>()) << "\n";
  if (!mesh) return;
  const auto& a2a = s["all_to_all_bytes_per_block_per_rank"];
  const int k = s["sequence_parallel"].get<int>();
  std::cout << "  sequence groups of " << k << " ranks (Ulysses): per block two all-to-alls, each rank sending "
            << human_bytes(a2a["qkv"].get<uint64_t>()) << " (q, k, v) and " << human_bytes(a2a["out"].get<uint64_t>())
            << " (attention output) per image, " << k - 1 << "/" << k << " of its shard; a group inside a node of "
            << s["gpus_per_node"].get<int>() << " GPUs uses the link above, one across nodes InfiniBand for its "
            << "cross-node share; rank (g, k) sends its shard to rank (g + 1, k)\n";
}

// A map's name for a table column: a JSON map by its file name.
std::string map_label(const nlohmann::ordered_json& map) {
  const std::string name = map["map"].get<std::string>();
  const auto slash = name.rfind('/');
  return (slash == std::string::npos ? name : name.substr(slash + 1)).substr(0, 16);
}

// "0->1", or with a mesh "0->1-3" (rank 0's scatter), "2-3->0" (its gather), "0->2 x2" (one link per shard).
std::string link_route(const nlohmann::ordered_json& l) {
  const int from = l["from_rank"].get<int>(), to = l["to_rank"].get<int>();
  if (!l.contains("parallel_links")) return str(from, "->", to);
  const int peers = l["peer_ranks"].get<int>(), parallel = l["parallel_links"].get<int>();
  const auto span = [&](int first) { return peers > 1 ? str(first, "-", first + peers - 1) : std::to_string(first); };
  if (parallel > 1) return str(from, "->", to, " x", parallel);
  return to == 0 ? str(span(from), "->0") : str("0->", span(to));
}

}  // namespace

void print_simulation(const nlohmann::ordered_json& sim) {
  const bool mesh = sim.contains("sequence_parallel");
  std::cout << "\nsimulated denoising ring (efficiency = images/s / (ranks x one GPU's images/s); bubble = idle "
               "share of stage time):\n";
  print_simulation_settings(sim);
  std::cout << "  map              ranks stages prompts  images    total s   images/s  1-prompt s   bubble  "
               "efficiency  "
            << (mesh ? "a2a/step/rank  busy per stage group (first rank:%)\n" : "busy per stage (rank:%)\n");
  char line[256];
  for (const auto& m : sim["maps"]) {
    const std::string name = map_label(m);
    if (m.contains("unsupported")) {
      std::cout << "  " << std::left << std::setw(16) << name << std::right << " not simulated: "
                << m["unsupported"].get<std::string>() << "\n";
      continue;
    }
    for (const auto& r : m["runs"]) {
      std::snprintf(line, sizeof(line), "  %-16s %5d %6zu %7lld %7lld %10.3f %10.3f %11.3f %8s %11s  ", name.c_str(),
                    m["ranks"].get<int>(), r["stages"].size(), static_cast<long long>(r["prompts"].get<int64_t>()),
                    static_cast<long long>(r["images"].get<int64_t>()), r["total_s"].get<double>(),
                    r["images_per_s"].get<double>(), m["latency_one_prompt_s"].get<double>(),
                    percent(r["bubble_fraction"].get<double>()).c_str(), percent(r["efficiency"].get<double>()).c_str());
      std::cout << line;
      if (mesh) {
        // The busiest rank's all-to-alls in one step of one microbatch (the stage group with the most blocks).
        double ms = 0;
        uint64_t bytes = 0;
        for (const auto& a : m["all_to_all"]) {
          ms = std::max(ms, a["ms_per_step_per_rank"].get<double>());
          bytes = std::max(bytes, a["bytes_per_step_per_rank"].get<uint64_t>());
        }
        std::snprintf(line, sizeof(line), "%9s %5.2f ms", human_bytes(bytes).c_str(), ms);
        std::cout << line;
      }
      for (const auto& st : r["stages"])
        std::cout << " " << st["rank"].get<int>() << ":" << std::lround(100.0 * st["busy_fraction"].get<double>());
      std::cout << "\n";
    }
  }
  std::cout << "  stage compute per microbatch step (ms), and per link at the most prompts: bytes per denoising step "
               "/ in total (busy share)\n";
  for (const auto& m : sim["maps"]) {
    if (m.contains("unsupported")) continue;
    std::cout << "  " << std::left << std::setw(16) << map_label(m) << std::right
              << " stages (" << m["stage_times_from"].get<std::string>() << (mesh ? ", one rank" : "") << "):";
    for (const auto& ms : m["stage_ms"]) {
      std::snprintf(line, sizeof(line), " %.2f", ms.get<double>());
      std::cout << line;
    }
    if (mesh) {
      std::cout << "\n" << std::string(18, ' ') << "all-to-all per step and rank:";
      std::string separator = " ";
      for (const auto& a : m["all_to_all"]) {
        std::snprintf(line, sizeof(line), "%sgroup %d (%lld blocks, %lld all-to-alls) %s in %.2f ms over %s",
                      separator.c_str(), a["stage_group"].get<int>(), static_cast<long long>(a["blocks"].get<int64_t>()),
                      static_cast<long long>(a["all_to_alls_per_step"].get<int64_t>()),
                      human_bytes(a["bytes_per_step_per_rank"].get<uint64_t>()).c_str(),
                      a["ms_per_step_per_rank"].get<double>(), a["link"]["name"].get<std::string>().c_str());
        std::cout << line;
        separator = ", ";
      }
    }
    const auto& r = m["runs"].back();
    std::cout << "\n" << std::string(18, ' ') << "links (" << r["prompts"].get<int64_t>() << " prompts):";
    if (r["links"].empty()) std::cout << " none, one rank";
    std::string separator = " ";
    for (const auto& l : r["links"]) {
      std::cout << separator << link_route(l) << " " << human_bytes(l["bytes_per_step"].get<uint64_t>()) << " / "
                << human_bytes(l["bytes_total"].get<uint64_t>()) << " (" << percent(l["busy_fraction"].get<double>())
                << ")";
      separator = ", ";
    }
    std::cout << "\n";
  }
}

void print_sweep(const nlohmann::ordered_json& sweep) {
  std::cout << "\nsimulated sweep: the time-balanced \"pipeline\" split on N GPUs of "
            << human_bytes(sweep["gpu_memory_bytes"].get<uint64_t>())
            << " each (efficiency = images/s / (N x one GPU's images/s)):\n";
  print_simulation_settings(sweep);
  std::cout << "   GPUs stages prompts  images    total s   images/s  1-prompt s   bubble  efficiency  slowest stage ms\n";
  char line[256];
  for (const auto& r : sweep["rows"]) {
    if (r.contains("infeasible")) {
      std::cout << "  " << std::setw(5) << r["gpus"].get<int>() << "  infeasible: " << r["infeasible"].get<std::string>() << "\n";
      continue;
    }
    std::snprintf(line, sizeof(line), "  %5d %6zu %7lld %7lld %10.3f %10.3f %11.3f %8s %11s %17.2f\n",
                  r["gpus"].get<int>(), r["stages"].get<size_t>(), static_cast<long long>(r["prompts"].get<int64_t>()),
                  static_cast<long long>(r["images"].get<int64_t>()), r["total_s"].get<double>(),
                  r["images_per_s"].get<double>(), r["latency_one_prompt_s"].get<double>(),
                  percent(r["bubble_fraction"].get<double>()).c_str(), percent(r["efficiency"].get<double>()).c_str(),
                  r["slowest_stage_ms"].get<double>());
    std::cout << line;
  }
}

void print_mesh_sweep(const nlohmann::ordered_json& sweep) {
  const int world = sweep["world_size"].get<int>();
  const auto& link = sweep["link"];
  char line[512];
  std::snprintf(line, sizeof(line),
                "\nsimulated meshes of %d GPUs of %s each: S pipeline stage groups x K sequence-parallel ranks "
                "(Ulysses)\n  %d steps at %s; latency: 1 prompt (%lld image(s)); throughput: %lld prompt(s) "
                "(%lld image(s)), efficiency = images/s / (%d x one GPU's)\n  link %s: %.1f GB/s and %.1f us; a "
                "sequence group inside a node of %d GPUs all-to-alls over it, across nodes over ib\n",
                world, human_bytes(sweep["gpu_memory_bytes"].get<uint64_t>()).c_str(), sweep["steps"].get<int>(),
                sweep["resolution"].get<std::string>().c_str(),
                static_cast<long long>(sweep["latency_images"].get<int64_t>()),
                static_cast<long long>(sweep["prompts"].get<int64_t>()),
                static_cast<long long>(sweep["throughput_images"].get<int64_t>()), world,
                link["name"].get<std::string>().c_str(), link["gb_per_s"].get<double>(), link["latency_us"].get<double>(),
                sweep["gpus_per_node"].get<int>());
  std::cout << line
            << "   S x K   weights/GPU  rank ms/step  a2a ms/step  a2a/step/rank  latency s   images/s  efficiency   "
               "bubble\n";
  for (const auto& r : sweep["rows"]) {
    const std::string shape = str(r["stages"].get<int>(), " x ", r["sequence_parallel"].get<int>());
    if (r.contains("excluded")) {
      std::snprintf(line, sizeof(line), "  %6s   excluded: %s\n", shape.c_str(), r["excluded"].get<std::string>().c_str());
      std::cout << line;
      continue;
    }
    std::snprintf(line, sizeof(line), "  %6s %13s %13.2f %12.2f %14s %10.3f %10.3f %11s %8s", shape.c_str(),
                  human_bytes(r["weights_bytes_per_gpu"].get<uint64_t>()).c_str(), r["rank_step_ms"].get<double>(),
                  r["all_to_all_ms_per_step"].get<double>(),
                  human_bytes(r["all_to_all_bytes_per_step"].get<uint64_t>()).c_str(), r["latency_s"].get<double>(),
                  r["images_per_s"].get<double>(), percent(r["efficiency"].get<double>()).c_str(),
                  percent(r["bubble_fraction"].get<double>()).c_str());
    std::cout << line;
    if (r["best_latency"].get<bool>()) std::cout << "  <- best latency";
    if (r["best_throughput"].get<bool>()) std::cout << "  <- best throughput";
    std::cout << "\n";
  }
  if (sweep["best_latency"].is_null()) std::cout << "  no mesh fits: more memory per GPU, or more GPUs\n";
}

}  // namespace dp::cli
