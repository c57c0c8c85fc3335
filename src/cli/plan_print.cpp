// plan's text tables (cli/plan_print.h); the simulations' tables are in plan_simulation_print.cpp.
#include "cli/plan_print.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "cli/format.h"
#include "cli/plan_simulation.h"
#include "core/error.h"

namespace dp::cli {
namespace {

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

// With a mesh, map_ranks' ranks are stage groups: group d holds GPU d's blocks on ranks d x K ... d x K + K - 1.
void print_ranks(const nlohmann::ordered_json& ranks, const nlohmann::ordered_json& mesh) {
  const int count = ranks["ranks"].get<int>();
  if (mesh.is_null()) {
    std::cout << "ranks: " << count << " (GPU d of the map is rank d; launch with mpirun -np " << count << ")\n";
  } else {
    const int k = mesh["sequence_parallel"].get<int>();
    std::cout << "ranks: " << count * k << " = " << count << " stage group(s) x " << k
              << " (GPU d of the map is stage group d, ranks d x " << k << " ... d x " << k << " + " << k - 1
              << "; launch with mpirun -np " << count * k << " and --sequence-parallel " << k << ")\n";
  }
  if (ranks.contains("unsupported")) {
    std::cout << "  the multi-rank runtime cannot run this map: " << ranks["unsupported"].get<std::string>() << "\n";
    return;
  }
  if (mesh.is_null()) {
    std::cout << "  ring: " << ring_text(ranks) << "; rank 0 "
              << (ranks["ring"][0]["rank"].get<int>() == 0 ? "also coordinates" : "coordinates only") << "\n";
    return;
  }
  const int k = mesh["sequence_parallel"].get<int>();
  std::cout << "  ring:" << (ranks["ring"][0]["rank"].get<int>() == 0 ? "" : " rank 0 ->");
  for (const auto& s : ranks["ring"]) {
    const int group = s["rank"].get<int>();
    std::cout << " group " << group << " (ranks " << group * k << "-" << group * k + k - 1 << ") blocks ["
              << s["first_block"].get<int64_t>() << ", " << s["last_block"].get<int64_t>() << ") ->";
  }
  std::cout << " rank 0; rank 0 is shard 0 of group 0; rank (g, k) sends its token shard to rank (g + 1, k)\n";
}

// Milliseconds with two decimals, or as many as show three significant digits of a small figure: a tiny model's
// 0.0412 ms is not "0.00".
std::string ms_text(double ms) {
  int decimals = 2;
  if (ms > 0 && ms < 1) decimals = std::min(6, 2 - static_cast<int>(std::floor(std::log10(ms))));
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", decimals, ms);
  return text;
}

// `ranks`: what map_ranks says of the same map.
void print_timing_row(const nlohmann::ordered_json& t, const nlohmann::ordered_json& ranks) {
  char line[256];
  std::snprintf(line, sizeof(line), "  %-16s %9s %9s %11.3f %11.1f%% %6d%s ", t["strategy"].get<std::string>().c_str(),
                ms_text(t["max_stage_ms"].get<double>()).c_str(), ms_text(t["mean_stage_ms"].get<double>()).c_str(),
                t["imbalance"].get<double>(), 100.0 * t["pipeline_efficiency"].get<double>(), ranks["ranks"].get<int>(),
                ranks.contains("unsupported") ? "*" : " ");
  std::cout << line;
  for (const auto& s : t["stages"]) {
    const double ms = s["ms"].get<double>();
    std::snprintf(line, sizeof(line), " %s:%s", device_text(s["device"]).c_str(),
                  ms >= 1 ? str(std::fixed, std::setprecision(1), ms).c_str() : ms_text(ms).c_str());
    std::cout << line;
  }
  std::cout << "\n";
}

// The map asked for: its modules, ranks, devices and predicted stage times next to "balanced" and "pipeline".
void print_placement(const nlohmann::ordered_json& plan) {
  std::cout << "model: " << plan["model"].get<std::string>() << "  (dtype " << plan["dtype"].get<std::string>()
            << (plan.contains("dtype_from") ? ", " + plan["dtype_from"].get<std::string>() : std::string())
            << ", world of " << plan["world_size"].get<int>() << " GPU(s))\n";
  if (plan.contains("mesh")) {
    const auto& mesh = plan["mesh"];
    std::cout << "mesh: " << mesh["world_size"].get<int>() << " ranks = " << mesh["stages"].get<int>()
              << " pipeline stage group(s) x " << mesh["sequence_parallel"].get<int>()
              << " sequence-parallel ranks; below, GPU d is stage group d (each of its ranks holds its blocks) and "
                 "stage times and activations are one rank's, on its token shard\n";
  }
  std::cout << "max_memory (" << plan["max_memory_from"].get<std::string>() << "):";
  for (const auto& item : plan["max_memory"].items())
    std::cout << " " << item.key() << "=" << human_bytes(item.value().get<uint64_t>());
  std::cout << "\n\ntransformer '" << plan["transformer"]["component"].get<std::string>() << "' ("
            << human_bytes(plan["transformer"]["total_bytes"].get<uint64_t>()) << ") with --device-map "
            << plan["transformer"]["device_map"].get<std::string>() << "\n";
  if (plan.contains("block_weights"))
    std::cout << "block weights: " << plan["block_weights"].get<std::string>() << "\n";
  if (plan.contains("fp8_converting_holdback_bytes"))
    std::cout << "each GPU keeps " << human_bytes(plan["fp8_converting_holdback_bytes"].get<uint64_t>())
              << " free for the block being converted to FP8 as it loads\n";
  std::cout << "hf_device_map:\n";
  print_map(plan["hf_device_map"]);
  const nlohmann::ordered_json no_mesh;
  print_ranks(plan["ranks"], plan.contains("mesh") ? plan["mesh"] : no_mesh);

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
  // The comparison rows, but not again the strategy asked for (its row is the first).
  const std::string asked = plan["stage_times"]["strategy"].get<std::string>();
  if (asked != "balanced") print_timing_row(cmp["balanced"], cmp["balanced"]["ranks"]);
  if (asked == "pipeline") {
  } else if (cmp["pipeline"].contains("infeasible")) {
    std::cout << "  pipeline         infeasible: " << cmp["pipeline"]["infeasible"].get<std::string>() << "\n";
  } else {
    print_timing_row(cmp["pipeline"], cmp["pipeline"]["ranks"]);
  }
  if (plan.contains("mesh"))
    std::cout << "  (ranks: the stage groups the map needs, of " << plan["mesh"]["sequence_parallel"].get<int>()
              << " ranks each; ms: one rank's; * the multi-rank runtime cannot run it)\n";
  else
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

}  // namespace

void print_plan_text(const nlohmann::ordered_json& plan) {
  std::cout << "times: " << plan["calibration"]["message"].get<std::string>() << "\n";
  if (plan.contains("microbatch_choice")) std::cout << "microbatch: " << plan["microbatch_choice"]["reason"].get<std::string>() << "\n";
  print_placement(plan);
  if (plan.contains("simulation")) print_simulation(plan["simulation"]);
  if (plan.contains("simulation_sweep")) print_sweep(plan["simulation_sweep"]);
  if (plan.contains("mesh_sweep")) print_mesh_sweep(plan["mesh_sweep"]);
}

}  // namespace dp::cli
