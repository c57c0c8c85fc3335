#pragma once
// plan's options: what the command line fills in, and the CLI11 definitions with their help text. The checks that
// turn them into a placement::PlanRequest live in plan_request.h, the run in plan_command.cpp.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "cli/plan_simulation.h"
#include "placement/plan.h"

namespace dp::cli {

struct PlanOptions {
  placement::PlanRequest request;
  std::string max_memory;
  std::string components;
  std::string device = "cuda";  // plan places GPUs, usually from a machine without one: cuda unless told
  std::string dtype;            // empty: as generate picks it, bf16 on cuda and fp32 on cpu
  std::string block_times;
  std::string block_times_at = "1024x1024";
  std::string gpu_memory = "141GB";
  std::string cpu_memory = "128GB";
  int world_size = 0;  // read only when --world-size was given
  bool as_json = false;
  // --simulate and --simulate-sweep
  bool simulate = false;
  bool sweep = false;
  SimulationOptions simulation;
  bool prompts_given = false;
  int64_t microbatch_size = 0;  // when not given: --batch
  bool microbatch_given = false;
  bool batch_given = false;
  std::string stage_ms;
  bool sequence_parallel_given = false;
  // Measured block times (placement/calibration.h): --calibration FILE, else the default file when it exists.
  std::string calibration;
  std::string calibration_device;
  bool no_calibration = false;
  std::string revision;  // of a --model given as a Hugging Face id
};

// Adds plan's options and their help text to `cmd`, bound to `o` (whose map defaults to generate's).
void add_plan_options(CLI::App& cmd, PlanOptions& o);

// After parsing: records which of the options whose defaults cannot tell "left out" from a value were given.
void note_given_plan_options(const CLI::App& cmd, PlanOptions& o);

}  // namespace dp::cli
