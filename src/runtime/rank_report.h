#pragma once
// --report: what one rank did in the denoising phase, as JSON (PATH itself in a world of one, else
// PATH.rankN.json beside it).
#include <cstdint>
#include <string>

#include "models/flux/flux_offload.h"
#include "runtime/ring.h"
#include "runtime/run_context.h"

namespace dp::runtime {

struct RankFigures {
  RankTimes times;
  double load_seconds = 0;
  uint64_t load_bytes = 0;
  models::OffloadStats offload;
};

// Writes nothing without --report.
void write_rank_report(const RunContext& run, const RankFigures& figures);

}  // namespace dp::runtime
