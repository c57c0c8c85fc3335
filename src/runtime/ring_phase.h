#pragma once
// The ring phase: the denoising loop. The coordinator drives it (runtime/ring.h's RingExecutor under
// pipeline/denoise_loop.h), writing checkpoints at step boundaries and handing finished microbatches to the
// decode phase; every other rank runs its blocks for each message until the shutdown.
#include <ATen/ATen.h>

#include <functional>

#include "runtime/decode_phase.h"
#include "runtime/encode_phase.h"
#include "runtime/load_phase.h"
#include "runtime/rank_report.h"
#include "runtime/run_context.h"

namespace dp::runtime {

struct CoordinatorRing {
  at::Tensor final_latents;  // the batch's, when kept (latent output, or checkpoints)
  GenerateOutcome outcome;
  RankFigures figures;
};

// Rank 0: loads its blocks (inside the denoise stage's timing), runs the loop to the end or to a stop, shuts the
// ring down and tells every rank whether the run stopped.
CoordinatorRing coordinator_ring_phase(RunContext& run, const CoordinatorStart& start, CoordinatorImages& images);

// Any other rank: its stage (null without blocks) for every ring message until the shutdown; `on_decode` takes
// the coordinator's decode messages on the decoding rank.
RankTimes worker_ring_phase(RunContext& run, pipeline::FluxStage* stage, const std::function<void(Message&)>& on_decode);

}  // namespace dp::runtime
