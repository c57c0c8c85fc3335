// `diffpipe plan`: where every module would go, from configs and safetensors headers only (no GPU, no
// weights read): hf_device_map as diffusers/accelerate would compute it, per-device bytes, the ranks each
// map needs, and predicted stage times of the map next to "balanced" and diffpipe's time-balanced
// "pipeline". With --simulate, the denoising ring of each map replayed on paper (placement/ring_simulator.h);
// with --simulate-sweep, the "pipeline" split on 1 to 64 GPUs and every mesh of stage groups x sequence-parallel
// ranks of the world (cli/plan_simulation.h).
//
// The options are in plan_options.h, their checks in plan_request.h, the text output in plan_print.h.
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/plan_options.h"
#include "cli/plan_print.h"
#include "cli/plan_request.h"
#include "cli/plan_simulation.h"
#include "core/error.h"
#include "placement/plan.h"
#include "placement/ring_simulator.h"

namespace dp::cli {
namespace {

void run_plan(PlanOptions& o) {
  auto& r = o.request;
  const auto times = prepare_plan_request(o);
  auto& sim = o.simulation;
  auto plan = placement::make_plan(r);
  plan["calibration"] = times.calibration;
  if (!times.microbatch_choice.is_null()) plan["microbatch_choice"] = times.microbatch_choice;
  if (o.dtype.empty()) plan["dtype_from"] = str("the default for --device ", o.device);
  const int world = plan["world_size"].get<int>() * sim.sequence_parallel;
  if (sim.sequence_parallel > 1)
    plan["mesh"] = {{"world_size", world}, {"stages", plan["world_size"]}, {"sequence_parallel", sim.sequence_parallel},
                    {"rank", "stage x sequence_parallel + shard"}};

  // The ranks each map needs (GPU d is rank d) and the ring the runtime would build from it.
  const auto config = models::FluxConfig::from_json(nlohmann::json::parse(plan["transformer"]["config"].dump()),
                                                    "the transformer's config.json");
  plan["ranks"] = placement::to_json(placement::map_ranks(plan["hf_device_map"], config));
  for (const char* name : {"balanced", "pipeline"}) {
    auto& cmp = plan["comparison"][name];
    if (cmp.contains("hf_device_map")) cmp["ranks"] = placement::to_json(placement::map_ranks(cmp["hf_device_map"], config));
  }
  if (o.simulate || o.sweep) {
    plan["simulation"] = simulate_plan(r, sim, config, plan);
    if (o.sweep) {
      plan["simulation_sweep"] = simulate_sweep(r, sim, config, world);
      plan["mesh_sweep"] = simulate_mesh_sweep(r, sim, config, world);
    }
  }
  if (o.as_json) {
    std::cout << plan.dump(2) << "\n";
    return;
  }
  print_plan_text(plan);
}

CommandRegistrar registrar("plan", 40, [](CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "plan",
      "Show where every module would go: hf_device_map exactly as diffusers/accelerate compute it, per-device\n"
      "bytes and ranks, and predicted stage times next to \"balanced\" and the time-balanced \"pipeline\".\n"
      "Reads config.json files and safetensors headers only: no GPU, no weights.");
  auto o = std::make_shared<PlanOptions>();
  add_plan_options(*cmd, *o);
  cmd->callback([o, cmd] {
    note_given_plan_options(*cmd, *o);
    run_plan(*o);
  });
});

}  // namespace
}  // namespace dp::cli
