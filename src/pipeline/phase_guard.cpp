#include "pipeline/phase_guard.h"

#include "core/error.h"

namespace dp::pipeline {

void fail_out_of_memory(int rank, const std::string& phase, const c10::OutOfMemoryError& error) {
  // CUDA's message runs on with allocator advice ("If reserved but unallocated memory is large ...") and
  // documentation links: keep what it tried to allocate and what was in use.
  std::string reason = error.what_without_backtrace();
  for (const char* tail : {" If reserved but unallocated", "\n"}) {
    const auto cut = reason.find(tail);
    if (cut != std::string::npos) reason.resize(cut);
  }
  DP_FAIL("rank ", rank, " ran out of device memory while ", phase, ": ", reason,
          " (a rank's CUDA allocator is capped at its --max-memory entry: raise it, or split the model over more "
          "ranks)");
}

}  // namespace dp::pipeline
