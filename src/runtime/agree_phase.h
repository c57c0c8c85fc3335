#pragma once
// The agree phase: before anything loads, every rank checks that the others run the same build, transport,
// request, model and checkpoint, plans the components and the transformer split from the same headers, and
// checks that the plans agree. A disagreement fails on every rank, naming the ranks and their values.
#include "runtime/run_context.h"

namespace dp::runtime {

// Fills `run`'s agreed fields (transport, plans, layout); logs the phases' maps on the coordinator.
void agree_phase(RunContext& run);

}  // namespace dp::runtime
