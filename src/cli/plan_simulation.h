#pragma once
// `plan --simulate` and `--simulate-sweep`: the denoising ring of each map replayed on paper
// (placement/ring_simulator.h), on a mesh of stage groups x sequence-parallel ranks too
// (placement/mesh_simulation.h), and the sweeps over world sizes and over the meshes of one world.
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/flux/flux_config.h"
#include "placement/plan.h"

namespace dp::cli {

struct SimulationOptions {
  std::string link = "nvlink";
  double link_gbps = std::nan("");        // given: replaces the preset's bandwidth
  double link_latency_us = std::nan("");  // given: replaces the preset's latency
  bool no_overlap = false;
  int64_t prompts = 0;  // 0: 1, N and 4N for a world of N
  int64_t images_per_prompt = 1;
  int steps = 28;
  double euler_ms = 0.1;
  int max_in_flight = 0;         // 0: one per stage, as the runtime
  std::vector<double> stage_ms;  // --stage-ms: replaces the planned stage times of the map asked for
  int sequence_parallel = 1;     // K; the plan request's world is then the S stage groups
  int gpus_per_node = 8;         // where a sequence group's all-to-all leaves NVLink/PCIe for InfiniBand
};

// "rank 0 -> rank 1 blocks [0, 29) -> rank 2 blocks [29, 57) -> rank 0": the path of every step (`ranks` as
// placement::to_json(MapRanks) writes it).
std::string ring_text(const nlohmann::ordered_json& ranks);

// The requested map and the plan's "balanced" and "pipeline", simulated for the plan's world.
nlohmann::ordered_json simulate_plan(const placement::PlanRequest& request, const SimulationOptions& options,
                                     const models::FluxConfig& config, const nlohmann::ordered_json& plan);
// The "pipeline" split on 1, 2, 4 ... 64 GPUs and `world`, one GPU per stage (K = 1), each at --gpu-memory.
nlohmann::ordered_json simulate_sweep(const placement::PlanRequest& request, const SimulationOptions& options,
                                      const models::FluxConfig& config, int world);
// Every mesh S x K = `world` ranks, each GPU at --gpu-memory: one image's latency and the prompt count's
// throughput (--prompts, 4 x world without it), the best of each marked.
nlohmann::ordered_json simulate_mesh_sweep(const placement::PlanRequest& request, const SimulationOptions& options,
                                           const models::FluxConfig& config, int world);

void print_simulation(const nlohmann::ordered_json& simulation);
void print_sweep(const nlohmann::ordered_json& sweep);
void print_mesh_sweep(const nlohmann::ordered_json& sweep);

}  // namespace dp::cli
