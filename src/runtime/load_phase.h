#pragma once
// The load phase: this rank takes its device (capped at its --max-memory entry) and loads the transformer
// blocks the plan gives it, reading only their bytes.
#include <cstdint>
#include <memory>

#include "core/trace.h"
#include "pipeline/flux_stage.h"
#include "runtime/run_context.h"

namespace dp::runtime {

// --max-memory holds at run time too: this rank's CUDA caching allocator may not grow past its GPU's entry.
void cap_device_memory(const RunContext& run);

// Loads this rank's blocks (nothing for a rank without any) and logs the load's rate. `track`: where --trace draws
// the load and its warm-up (the background load track for the overlapped load, beside the encoders' spans).
LoadedStage load_phase(const RunContext& run, trace::Track track = trace::Track::host);

// Whether this rank's blocks load on a thread while its text encoders run, and why. The overlapped load runs on
// a CUDA stream of its own and may hold only `early_bytes` of blocks until the encoders are released, so that
// encoders and blocks together stay within the staged order's peak (the blocks and the loop's activations).
// Auto keeps the staged order: on the CPU (the loader and the encoders would share the same cores), under
// --max-memory, and on CUDA, where the bounded overlap measured no faster (6.16 s against 6.21-6.27 s, one H200).
struct LoadOverlap {
  bool overlap = false;
  std::string reason;
  uint64_t early_bytes = 0;
};
LoadOverlap choose_load_overlap(const RunContext& run);

// Logs the choice and, when it is to overlap, starts load_phase on a thread (run.early_load), which waits for
// encoder_weights_loaded before it reads anything.
void start_load_overlap(RunContext& run);

// The text encoders' weights on this rank are on the device (called from the thread that loaded them): the
// overlapped load may start. Also implied by encoders_released.
void encoder_weights_loaded(RunContext& run);

// The text encoders on this rank are done and their memory is returned: the overlapped load may take the rest.
void encoders_released(RunContext& run);

// This rank's blocks: the overlapped load's result when one was started, otherwise load_phase now.
LoadedStage take_loaded_stage(RunContext& run);

// The offloaded blocks' copies a stage streamed, logged when there were any.
void log_offload(const RunContext& run, const pipeline::FluxStage* stage);

}  // namespace dp::runtime
