// `diffpipe plan`: where every module would go, from configs and safetensors headers only (no GPU, no
// weights read): hf_device_map as diffusers/accelerate would compute it, per-device bytes, the ranks each
// map needs, and predicted stage times of the map next to "balanced" and diffpipe's time-balanced
// "pipeline". With --simulate, the denoising ring of each map replayed on paper (placement/ring_simulator.h);
// with --simulate-sweep, the "pipeline" split on 1 to 64 GPUs.
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>

#include "cli/command.h"
#include "cli/format.h"
#include "core/error.h"
#include "io/run_dtype.h"
#include "placement/flux_module_tree.h"
#include "placement/plan.h"
#include "placement/ring_simulator.h"

namespace dp::cli {
namespace {

struct PlanOptions {
  placement::PlanRequest request;
  std::string max_memory;
  std::string components;
  std::string dtype = "bf16";
  std::string block_times;
  std::string block_times_at = "1024x1024";
  std::string gpu_memory = "141GB";
  std::string cpu_memory = "128GB";
  int world_size = 0;  // read only when --world-size was given
  bool as_json = false;
  // --simulate and --simulate-sweep
  bool simulate = false;
  bool sweep = false;
  std::string link = "nvlink";
  double link_gbps = std::nan("");        // given: replaces the preset's bandwidth
  double link_latency_us = std::nan("");  // given: replaces the preset's latency
  bool no_overlap = false;
  int64_t prompts = 0;  // when not given: 1, N and 4N for a world of N
  bool prompts_given = false;
  int64_t images_per_prompt = 1;
  int64_t microbatch_size = 0;  // when not given: --batch
  bool microbatch_given = false;
  int steps = 28;
  double euler_ms = 0.1;
  int max_in_flight = 0;  // 0: one per stage, as the runtime
  std::string stage_ms;
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void parse_resolution(const std::string& text, int64_t* height, int64_t* width) {
  const auto x = text.find('x');
  DP_CHECK(x != std::string::npos && x > 0 && x + 1 < text.size(), "--block-times-at '", text,
           "' must be HEIGHTxWIDTH, as in 1024x1024");
  try {
    *height = std::stoll(text.substr(0, x));
    *width = std::stoll(text.substr(x + 1));
  } catch (const std::exception&) {
    DP_FAIL("--block-times-at '", text, "' must be HEIGHTxWIDTH, as in 1024x1024");
  }
}

std::string device_text(const nlohmann::ordered_json& value) {
  return value.is_number() ? std::to_string(value.get<int>()) : value.get<std::string>();
}

// Groups runs such as transformer_blocks.0 .. transformer_blocks.16 on one device into one line.
void print_map(const nlohmann::ordered_json& map) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& item : map.items()) entries.emplace_back(item.key(), device_text(item.value()));
  auto split_index = [](const std::string& key, std::string* stem, long* index) {
    const auto dot = key.rfind('.');
    if (dot == std::string::npos || dot + 1 == key.size()) return false;
    const std::string tail = key.substr(dot + 1);
    if (tail.find_first_not_of("0123456789") != std::string::npos) return false;
    *stem = key.substr(0, dot);
    *index = std::stol(tail);
    return true;
  };
  for (std::size_t i = 0; i < entries.size();) {
    std::string stem, next_stem;
    long first = 0, last = 0, next = 0;
    std::size_t j = i + 1;
    if (split_index(entries[i].first, &stem, &first)) {
      last = first;
      while (j < entries.size() && entries[j].second == entries[i].second &&
             split_index(entries[j].first, &next_stem, &next) && next_stem == stem && next == last + 1) {
        last = next;
        ++j;
      }
    }
    const std::string key = entries[i].first.empty() ? "\"\" (everything)"
                            : j > i + 1 ? stem + "." + std::to_string(first) + "-" + std::to_string(last)
                                        : entries[i].first;
    std::cout << "  " << std::left << std::setw(40) << key << " " << entries[i].second << "\n";
    i = j;
  }
}

std::string bytes_or_dash(const nlohmann::ordered_json& value) {
  return value.is_null() ? "unlimited" : human_bytes(static_cast<uint64_t>(std::max<int64_t>(value.get<int64_t>(), 0)));
}

// "rank 0 -> rank 1 blocks [0, 29) -> rank 2 blocks [29, 57) -> rank 0": the path of every step.
std::string ring_text(const nlohmann::ordered_json& ranks) {
  std::string text = ranks["ring"][0]["rank"].get<int>() == 0 ? "" : "rank 0";
  for (const auto& s : ranks["ring"])
    text += str(text.empty() ? "" : " -> ", s["text"].get<std::string>());
  return text + " -> rank 0";
}

void print_ranks(const nlohmann::ordered_json& ranks) {
  const int count = ranks["ranks"].get<int>();
  std::cout << "ranks: " << count << " (GPU d of the map is rank d; launch with mpirun -np " << count << ")\n";
  if (ranks.contains("unsupported")) {
    std::cout << "  the multi-rank runtime cannot run this map: " << ranks["unsupported"].get<std::string>() << "\n";
    return;
  }
  std::cout << "  ring: " << ring_text(ranks) << "; rank 0 "
            << (ranks["ring"][0]["rank"].get<int>() == 0 ? "also coordinates" : "coordinates only") << "\n";
}

// `ranks`: what map_ranks says of the same map.
void print_timing_row(const nlohmann::ordered_json& t, const nlohmann::ordered_json& ranks) {
  char line[256];
  std::snprintf(line, sizeof(line), "  %-16s %9.2f %9.2f %11.3f %11.1f%% %6d%s ", t["strategy"].get<std::string>().c_str(),
                t["max_stage_ms"].get<double>(), t["mean_stage_ms"].get<double>(), t["imbalance"].get<double>(),
                100.0 * t["pipeline_efficiency"].get<double>(), ranks["ranks"].get<int>(),
                ranks.contains("unsupported") ? "*" : " ");
  std::cout << line;
  for (const auto& s : t["stages"]) {
    std::snprintf(line, sizeof(line), " %s:%.1f", device_text(s["device"]).c_str(), s["ms"].get<double>());
    std::cout << line;
  }
  std::cout << "\n";
}

void print_plan(const nlohmann::ordered_json& plan) {
  std::cout << "model: " << plan["model"].get<std::string>() << "  (dtype " << plan["dtype"].get<std::string>()
            << ", world of " << plan["world_size"].get<int>() << " GPU(s))\n";
  std::cout << "max_memory (" << plan["max_memory_from"].get<std::string>() << "):";
  for (const auto& item : plan["max_memory"].items())
    std::cout << " " << item.key() << "=" << human_bytes(item.value().get<uint64_t>());
  std::cout << "\n\ntransformer '" << plan["transformer"]["component"].get<std::string>() << "' ("
            << human_bytes(plan["transformer"]["total_bytes"].get<uint64_t>()) << ") with --device-map "
            << plan["transformer"]["device_map"].get<std::string>() << "\nhf_device_map:\n";
  print_map(plan["hf_device_map"]);
  print_ranks(plan["ranks"]);

  std::cout << "\ndevices:\n  " << std::left << std::setw(8) << "device" << std::setw(6) << "rank" << std::right
            << std::setw(12) << "weights" << std::setw(12) << "reserved" << std::setw(12) << "budget" << std::setw(12)
            << "free" << "\n";
  for (const auto& d : plan["devices"]) {
    std::cout << "  " << std::left << std::setw(8) << device_text(d["device"]) << std::setw(6)
              << (d["rank"].is_null() ? std::string("-") : std::to_string(d["rank"].get<int>())) << std::right
              << std::setw(12) << human_bytes(d["weights_bytes"].get<uint64_t>()) << std::setw(12)
              << human_bytes(d["reserved_bytes"].get<uint64_t>()) << std::setw(12) << bytes_or_dash(d["budget_bytes"])
              << std::setw(12) << bytes_or_dash(d["free_bytes"]) << (d["offloaded"].get<bool>() ? "  (offloaded)" : "")
              << "\n";
  }

  const auto& cmp = plan["comparison"];
  std::cout << "\npredicted stage times per denoising step at " << cmp["resolution"].get<std::string>() << " ("
            << cmp["timing_source"].get<std::string>() << "):\n"
            << "  strategy           max ms   mean ms   imbalance  efficiency  ranks   per GPU (ms)\n";
  print_timing_row(plan["stage_times"], plan["ranks"]);
  print_timing_row(cmp["balanced"], cmp["balanced"]["ranks"]);
  if (cmp["pipeline"].contains("infeasible"))
    std::cout << "  pipeline         infeasible: " << cmp["pipeline"]["infeasible"].get<std::string>() << "\n";
  else
    print_timing_row(cmp["pipeline"], cmp["pipeline"]["ranks"]);
  std::cout << "  (ranks: the world the map needs, mpirun -np that many; * the multi-rank runtime cannot run it)\n";

  if (plan.contains("pipeline_hf_device_map")) {
    std::cout << "\npipeline_hf_device_map (pipeline-level \"balanced\"):\n";
    for (const auto& c : plan["components"]) {
      std::cout << "  " << std::left << std::setw(20) << c["component"].get<std::string>() << std::right << std::setw(12)
                << human_bytes(c["bytes"].get<uint64_t>()) << "  " << device_text(c["device"])
                << (c["offloaded"].get<bool>() ? "  (offloaded)" : "") << "\n";
    }
  }
}

// --- The ranks each map needs, and the ring simulated ---

std::vector<double> parse_stage_ms(const std::string& text) {
  std::vector<double> out;
  for (const auto& part : split_commas(text)) {
    double ms = -1;
    size_t used = 0;
    try {
      ms = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DP_CHECK(used == part.size() && std::isfinite(ms) && ms >= 0, "--stage-ms '", text, "': '", part,
             "' is not a non-negative number of milliseconds");
    out.push_back(ms);
  }
  DP_CHECK(!out.empty(), "--stage-ms '", text, "' gives no stage time; give one per ring stage, as in 41.5,40.9");
  return out;
}

// What every simulation of this plan shares: the transformer, its unit times per microbatch, message sizes,
// the link and the workload.
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
};

SimulationContext simulation_context(const PlanOptions& o, const models::FluxConfig& config) {
  SimulationContext c;
  c.config = config;
  const auto& timing = o.request.timing;
  c.units = placement::flux_timed_units(c.config, placement::flux_module_tree(c.config, o.request.dtype), timing);
  c.bytes = placement::flux_ring_message_bytes(c.config, timing.height, timing.width, timing.text_tokens, o.request.dtype);
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
  return c;
}

placement::RingSimulation simulate(const SimulationContext& c, const std::vector<placement::RankStage>& stages,
                                   const std::vector<double>& stage_ms, int64_t images) {
  placement::RingSimulationInput in;
  for (const auto& s : stages) in.stage_ranks.push_back(s.rank);
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
  return placement::simulate_ring(in);
}

// One GPU holding every block: the ceiling a world of N is measured against (N times its images/s).
double one_gpu_images_per_s(const SimulationContext& c, const std::vector<double>& stage_ms, int64_t images) {
  double sum = 0;
  for (double ms : stage_ms) sum += ms;
  return simulate(c, {{0, 0, c.config.num_blocks()}}, {sum}, images).images_per_s;
}

nlohmann::ordered_json simulated_run(const SimulationContext& c, const placement::MapRanks& ranks,
                                     const std::vector<double>& stage_ms, int64_t prompts) {
  const int64_t images = prompts * c.images_per_prompt;
  const auto sim = simulate(c, ranks.stages, stage_ms, images);
  const double ceiling = one_gpu_images_per_s(c, stage_ms, images);
  nlohmann::ordered_json run = {{"prompts", prompts}, {"images", images}};
  run.update(placement::to_json(sim));
  run["one_gpu_images_per_s"] = ceiling;
  run["efficiency"] = ceiling > 0 ? sim.images_per_s / (ranks.ranks * ceiling) : 0.0;
  return run;
}

// 1, N and 4N prompts for a world of N, unless --prompts names one count (asked > 0).
std::vector<int64_t> prompt_counts(int64_t asked, int world) {
  if (asked > 0) return {asked};
  const std::set<int64_t> counts = {1, world, 4 * static_cast<int64_t>(world)};
  return {counts.begin(), counts.end()};
}

nlohmann::ordered_json simulate_map(const SimulationContext& c, const std::string& name,
                                    const nlohmann::ordered_json& hf_device_map, const std::vector<double>& override_ms,
                                    const std::vector<int64_t>& prompts) {
  const auto ranks = placement::map_ranks(hf_device_map, c.config);
  nlohmann::ordered_json out = {{"map", name}, {"ranks", ranks.ranks}};
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
  out["latency_one_prompt_s"] = simulate(c, ranks.stages, stage_ms, c.images_per_prompt).total_ms * 1e-3;
  out["runs"] = nlohmann::ordered_json::array();
  for (int64_t m : prompts) out["runs"].push_back(simulated_run(c, ranks, stage_ms, m));
  return out;
}

nlohmann::ordered_json simulation_settings(const SimulationContext& c, const PlanOptions& o) {
  return {{"link", placement::to_json(c.link)}, {"transfers_overlap_compute", c.overlap}, {"steps", c.steps},
          {"resolution", std::to_string(o.request.timing.height) + "x" + std::to_string(o.request.timing.width)},
          {"microbatch_size", c.microbatch_size}, {"images_per_prompt", c.images_per_prompt},
          {"euler_ms_per_microbatch_step", c.euler_ms},
          {"max_in_flight", c.max_in_flight > 0 ? nlohmann::ordered_json(c.max_in_flight) : nlohmann::ordered_json("one per stage")},
          {"message_bytes_per_image", {{"prompts_once", c.bytes.prompts}, {"step_inputs", c.bytes.step_inputs},
                                       {"activations", c.bytes.activations}, {"noise", c.bytes.noise}}}};
}

// The requested map and the comparison's "balanced" and "pipeline", each for the plan's world.
nlohmann::ordered_json simulate_plan(const SimulationContext& c, const PlanOptions& o, const nlohmann::ordered_json& plan) {
  nlohmann::ordered_json out = simulation_settings(c, o);
  const auto prompts = prompt_counts(o.prompts_given ? o.prompts : 0, plan["world_size"].get<int>());
  const auto override_ms = o.stage_ms.empty() ? std::vector<double>{} : parse_stage_ms(o.stage_ms);
  out["maps"] = nlohmann::ordered_json::array();
  const std::string requested = o.request.device_map;
  out["maps"].push_back(simulate_map(c, requested, plan["hf_device_map"], override_ms, prompts));
  for (const char* name : {"balanced", "pipeline"}) {
    const auto& cmp = plan["comparison"][name];
    if (requested == name || !cmp.contains("hf_device_map")) continue;
    out["maps"].push_back(simulate_map(c, name, cmp["hf_device_map"], {}, prompts));
  }
  return out;
}

// The time-balanced split on N = 1, 2, 4 ... 64 GPUs (and the world asked for), each GPU at --gpu-memory.
nlohmann::ordered_json simulate_sweep(const SimulationContext& c, const PlanOptions& o, int world) {
  nlohmann::ordered_json out = simulation_settings(c, o);
  out["strategy"] = "pipeline";
  out["gpu_memory_bytes"] = o.request.gpu_memory_bytes;
  out["rows"] = nlohmann::ordered_json::array();
  std::set<int> worlds = {1, 2, 4, 8, 16, 32, 64, world};
  for (int n : worlds) {
    placement::PlanRequest request = o.request;
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
  std::cout << line << "  messages per image: prompts " << human_bytes(bytes["prompts_once"].get<uint64_t>())
            << " (once), step inputs " << human_bytes(bytes["step_inputs"].get<uint64_t>()) << ", activations "
            << human_bytes(bytes["activations"].get<uint64_t>()) << " per stage boundary, noise "
            << human_bytes(bytes["noise"].get<uint64_t>()) << "\n";
}

// A map's name for a table column: a JSON map by its file name.
std::string map_label(const nlohmann::ordered_json& map) {
  const std::string name = map["map"].get<std::string>();
  const auto slash = name.rfind('/');
  return (slash == std::string::npos ? name : name.substr(slash + 1)).substr(0, 16);
}

void print_simulation(const nlohmann::ordered_json& sim) {
  std::cout << "\nsimulated denoising ring (efficiency = images/s / (ranks x one GPU's images/s); bubble = idle "
               "share of stage time):\n";
  print_simulation_settings(sim);
  std::cout << "  map              ranks stages prompts  images    total s   images/s  1-prompt s   bubble  "
               "efficiency  busy per stage (rank:%)\n";
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
              << " stages (" << m["stage_times_from"].get<std::string>() << "):";
    for (const auto& ms : m["stage_ms"]) {
      std::snprintf(line, sizeof(line), " %.2f", ms.get<double>());
      std::cout << line;
    }
    const auto& r = m["runs"].back();
    std::cout << "\n" << std::string(18, ' ') << "links (" << r["prompts"].get<int64_t>() << " prompts):";
    if (r["links"].empty()) std::cout << " none, one rank";
    std::string separator = " ";
    for (const auto& l : r["links"]) {
      std::cout << separator << l["from_rank"].get<int>() << "->" << l["to_rank"].get<int>() << " "
                << human_bytes(l["bytes_per_step"].get<uint64_t>()) << " / "
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

void run_plan(PlanOptions& o) {
  auto& r = o.request;
  r.dtype = io::parse_run_dtype(o.dtype);
  if (!o.max_memory.empty()) r.max_memory = placement::read_max_memory_argument(o.max_memory);
  r.pipeline_components = split_commas(o.components);
  r.gpu_memory_bytes = placement::parse_memory_size(o.gpu_memory, "--gpu-memory");
  r.cpu_memory_bytes = placement::parse_memory_size(o.cpu_memory, "--cpu-memory");
  if (!o.block_times.empty()) {
    const auto parts = split_commas(o.block_times);
    DP_CHECK(parts.size() == 2, "--block-times '", o.block_times, "' must be DOUBLE_MS,SINGLE_MS, as in 3.07,2.85");
    try {
      r.timing.double_block_ms = std::stod(parts[0]);
      r.timing.single_block_ms = std::stod(parts[1]);
    } catch (const std::exception&) {
      DP_FAIL("--block-times '", o.block_times, "' must be two numbers of milliseconds, as in 3.07,2.85");
    }
    parse_resolution(o.block_times_at, &r.timing.measured_height, &r.timing.measured_width);
  }
  if (o.microbatch_given) {
    DP_CHECK(o.microbatch_size >= 1, "--microbatch-size must be at least 1, got ", o.microbatch_size);
    r.timing.batch = o.microbatch_size;  // generate plans at its microbatch size too
  }
  if (o.simulate || o.sweep) {
    DP_CHECK(!o.prompts_given || o.prompts >= 1, "--prompts must be at least 1, got ", o.prompts);
    DP_CHECK(o.images_per_prompt >= 1, "--images-per-prompt must be at least 1, got ", o.images_per_prompt);
    DP_CHECK(!(o.sweep && !o.stage_ms.empty()), "--stage-ms replaces the stage times of one map; --simulate-sweep "
             "plans a new split for every N, so the two do not go together");
    placement::link_preset(o.link);  // a wrong name fails before the headers are read
  }
  auto plan = placement::make_plan(r);

  // The ranks each map needs (GPU d is rank d) and the ring the runtime would build from it.
  const auto config = models::FluxConfig::from_json(nlohmann::json::parse(plan["transformer"]["config"].dump()),
                                                    "the transformer's config.json");
  plan["ranks"] = placement::to_json(placement::map_ranks(plan["hf_device_map"], config));
  for (const char* name : {"balanced", "pipeline"}) {
    auto& cmp = plan["comparison"][name];
    if (cmp.contains("hf_device_map")) cmp["ranks"] = placement::to_json(placement::map_ranks(cmp["hf_device_map"], config));
  }
  if (o.simulate || o.sweep) {
    const SimulationContext context = simulation_context(o, config);
    plan["simulation"] = simulate_plan(context, o, plan);
    if (o.sweep) plan["simulation_sweep"] = simulate_sweep(context, o, plan["world_size"].get<int>());
  }
  if (o.as_json) {
    std::cout << plan.dump(2) << "\n";
    return;
  }
  print_plan(plan);
  if (plan.contains("simulation")) print_simulation(plan["simulation"]);
  if (plan.contains("simulation_sweep")) print_sweep(plan["simulation_sweep"]);
}

CommandRegistrar registrar("plan", 40, [](CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "plan",
      "Show where every module would go: hf_device_map exactly as diffusers/accelerate compute it, per-device\n"
      "bytes and ranks, and predicted stage times next to \"balanced\" and the time-balanced \"pipeline\".\n"
      "Reads config.json files and safetensors headers only: no GPU, no weights.");
  auto o = std::make_shared<PlanOptions>();
  cmd->add_option("--model", o->request.model_dir, "diffusers model folder (or the transformer folder)")->required();
  cmd->add_option("--device-map", o->request.device_map,
                  "transformer placement: auto, balanced, balanced_low_0, sequential (accelerate's), pipeline\n"
                  "(diffpipe's contiguous stages balanced by time), or FILE.json with a custom map such as\n"
                  "{\"transformer_blocks\": 0, \"single_transformer_blocks\": 1}")
      ->capture_default_str();
  cmd->add_option("--pipeline-device-map", o->request.pipeline_device_map,
                  "place whole components too; only \"balanced\" (as diffusers' pipeline-level device_map)");
  cmd->add_option("--components", o->components,
                  "components for --pipeline-device-map, comma-separated (default: every component with weights,\n"
                  "the transformer included, as FluxPipeline.from_pretrained(device_map=\"balanced\"); the guide's\n"
                  "encoders-only step, transformer=None and vae=None, is text_encoder,text_encoder_2)");
  cmd->add_option("--max-memory", o->max_memory,
                  "per-device budgets: 0=16GB,1=16GB,cpu=64GB or FILE.json ({\"0\": \"16GB\"}). GB/MB/KB are powers\n"
                  "of 1000, GiB/MiB/KiB of 1024, plain integers are bytes. Devices left out get nothing.\n"
                  "Default: every GPU of the world at --gpu-memory, plus cpu at --cpu-memory");
  auto* world_size = cmd->add_option(
      "--world-size", o->world_size,
      str("number of GPUs (ranks), 1 to ", placement::kMaxWorldSize,
          "; left out, one past the highest GPU --max-memory names (1 without --max-memory)"));
  cmd->add_option("--height", o->request.timing.height, "image height for activation and time estimates")->capture_default_str();
  cmd->add_option("--width", o->request.timing.width, "image width")->capture_default_str();
  auto* batch = cmd->add_option("--batch", o->request.timing.batch, "images per micro-batch")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "run dtype: bf16, fp16 or fp32")->capture_default_str();
  cmd->add_option("--block-times", o->block_times,
                  "measured ms per double,single block (H200 bf16 at 1024x1024: 3.07,2.85); default: FLOPs only");
  cmd->add_option("--block-times-at", o->block_times_at, "resolution the block times were measured at")->capture_default_str();
  cmd->add_option("--tflops", o->request.timing.sustained_tflops, "sustained TFLOP/s for the FLOP-only estimate")
      ->capture_default_str();
  cmd->add_flag("--cuda-caps", o->request.cuda_caps,
                "plan as `generate --device cuda --max-memory` does, where max_memory also caps each rank's CUDA\n"
                "allocator: auto/balanced/sequential place weights in each GPU's max_memory less the activations,\n"
                "the allocator reserve and two streamed blocks (without it: exactly accelerate's map)");
  cmd->add_option("--gpu-memory", o->gpu_memory, "assumed free memory per GPU without --max-memory")->capture_default_str();
  cmd->add_option("--cpu-memory", o->cpu_memory, "assumed host memory without --max-memory")->capture_default_str();
  cmd->add_flag("--json", o->as_json,
                "print one JSON object (hf_device_map, pipeline_hf_device_map, devices, ranks, stage times, and\n"
                "the simulation when asked for)");
  // The simulator: placement/ring_simulator.h.
  cmd->add_flag("--simulate", o->simulate,
                "replay the denoising ring of this map, \"balanced\" and \"pipeline\" on paper: images/s, one-prompt\n"
                "latency, bubble (idle share of stage time), busy share per stage and bytes on every link");
  cmd->add_flag("--simulate-sweep", o->sweep,
                "also simulate the \"pipeline\" split on N = 1, 2, 4 ... 64 GPUs (and --world-size) for 1, N and 4N\n"
                "prompts, each GPU at --gpu-memory");
  cmd->add_option("--link", o->link, "link between ring neighbours:\n" + placement::link_presets_help())
      ->capture_default_str();
  cmd->add_option("--link-gbps", o->link_gbps, "link bandwidth in GB/s (one direction), replacing --link's");
  cmd->add_option("--link-latency-us", o->link_latency_us, "latency of one message in microseconds, replacing --link's");
  cmd->add_flag("--no-overlap", o->no_overlap,
                "a rank waits for its sends to finish before computing again (the runtime overlaps them)");
  auto* prompts = cmd->add_option("--prompts", o->prompts, "prompts to simulate (default: 1, N and 4N for a world of N)");
  cmd->add_option("--images-per-prompt,--num-images-per-prompt", o->images_per_prompt, "images per prompt")
      ->capture_default_str();
  auto* microbatch = cmd->add_option("--microbatch-size", o->microbatch_size,
                  "images per microbatch, as generate's option; also the --batch the plan is made for")
      ->excludes(batch);
  cmd->add_option("--steps", o->steps, "denoising steps")->capture_default_str();
  cmd->add_option("--euler-ms", o->euler_ms,
                  "rank 0's time per microbatch step for the Euler update and the loop (an estimate; --report measures it)")
      ->capture_default_str();
  cmd->add_option("--max-in-flight", o->max_in_flight,
                  "steps in flight at once (default: one per ring stage, as the runtime); more hides transfer time");
  cmd->add_option("--stage-ms", o->stage_ms,
                  "replace the planned compute time of each ring stage of this map (ms per microbatch step, in ring\n"
                  "order), e.g. measured ones from generate --report");
  cmd->callback([o, world_size, prompts, microbatch] {
    if (world_size->count() > 0) o->request.world_size = o->world_size;
    o->prompts_given = prompts->count() > 0;
    o->microbatch_given = microbatch->count() > 0;
    run_plan(*o);
  });
});

}  // namespace
}  // namespace dp::cli
