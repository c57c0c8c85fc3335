#include "cli/trace_option.h"

namespace dp::cli {

void add_trace_option(CLI::App& generate, runtime::RuntimeOptions& options) {
  generate.add_option("--trace", options.trace_path,
                      "write a timeline of the run as Chrome trace-event JSON (open it in https://ui.perfetto.dev or "
                      "chrome://tracing): one process per rank, one track per stream (host: load, encode, decode, "
                      "checkpoint copies; compute: each block range per microbatch step, CUDA-event times on GPU; "
                      "send; receive; checkpoint writer), every rank's clock aligned to rank 0's and merged by rank 0 "
                      "into this one file at the end of the run. CUDA builds also mark the same names as NVTX ranges "
                      "for Nsight Systems");
}

}  // namespace dp::cli
