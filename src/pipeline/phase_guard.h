#pragma once
// The phases of a rank's work (encoding prompts, loading blocks [a, b), denoising, decoding) each name
// themselves when the device runs out of memory. LibTorch's out-of-memory error (an allocation past the rank's
// --max-memory cap, or past the device) is a long message without the rank or what was running; it becomes one
// line that says both. Other errors pass through unchanged.
#include <c10/util/Exception.h>

#include "core/trace.h"

#include <string>
#include <utility>

namespace dp::pipeline {

// Throws dp::Error: "rank R ran out of device memory while PHASE: <LibTorch's first sentences>".
[[noreturn]] void fail_out_of_memory(int rank, const std::string& phase, const c10::OutOfMemoryError& error);

// `track`: where --trace draws the phase; a phase on a helper thread beside the host's own work takes a track of
// its own, since spans on one track must nest.
template <typename Work>
auto run_phase(int rank, const std::string& phase, Work&& work, trace::Track track = trace::Track::host)
    -> decltype(work()) {
  trace::Scope span(track, phase);  // --trace and NVTX
  try {
    return std::forward<Work>(work)();
  } catch (const c10::OutOfMemoryError& error) {
    fail_out_of_memory(rank, phase, error);
  }
}

}  // namespace dp::pipeline
