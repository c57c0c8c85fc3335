// The text form of `plan --simulate` and `--simulate-sweep` (the JSON that cli/plan_simulation.cpp builds).
#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>

#include "cli/format.h"
#include "cli/plan_simulation.h"
#include "core/error.h"

namespace dp::cli {
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
                "\nsimulated meshes of %d GPU(s) of %s each: S pipeline stage groups x K sequence-parallel ranks "
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
