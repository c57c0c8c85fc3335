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

struct LoadedStage {
  std::shared_ptr<pipeline::FluxStage> stage;  // null on a rank without blocks
  double seconds = 0;
  uint64_t bytes = 0;
};

// Loads this rank's blocks (nothing for a rank without any) and logs the load's rate.
LoadedStage load_phase(const RunContext& run);

// The offloaded blocks' copies a stage streamed, logged when there were any.
void log_offload(const RunContext& run, const pipeline::FluxStage* stage);

}  // namespace dp::runtime
