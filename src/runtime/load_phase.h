#pragma once
// The load phase: this rank takes its device (capped at its --max-memory entry) and loads the transformer
// blocks the plan gives it, reading only their bytes.
#include <cstdint>
#include <memory>

#include "pipeline/flux_stage.h"
#include "runtime/run_context.h"

namespace dp::runtime {

// --max-memory holds at run time too: this rank's CUDA caching allocator may not grow past its GPU's entry.
void cap_device_memory(const RunContext& run);

// Loads this rank's blocks (nothing for a rank without any) and logs the load's rate.
LoadedStage load_phase(const RunContext& run);

// Whether this rank's blocks load on a thread while its text encoders run, and why. Auto chooses it on CUDA when
// the device holds the encoders, the blocks and a margin for activations at once and no --max-memory cap
// asks for the staged order; never on the CPU, where the loader and the encoders would share the same cores.
struct LoadOverlap {
  bool overlap = false;
  std::string reason;
};
LoadOverlap choose_load_overlap(const RunContext& run);

// Logs the choice and, when it is to overlap, starts load_phase on a thread (run.early_load).
void start_load_overlap(RunContext& run);

// This rank's blocks: the overlapped load's result when one was started, otherwise load_phase now.
LoadedStage take_loaded_stage(RunContext& run);

// The offloaded blocks' copies a stage streamed, logged when there were any.
void log_offload(const RunContext& run, const pipeline::FluxStage* stage);

}  // namespace dp::runtime
