#include "cli/trace_option.h"

namespace dp::cli {

void add_trace_options(CLI::App& generate, runtime::RuntimeOptions& options) {
  generate.add_option("--trace", options.trace_path,
                      "write a timeline of the run as Chrome trace-event JSON (open it in https://ui.perfetto.dev or "
                      "chrome://tracing): one process per rank, one track per stream (host: load, encode, decode, "
                      "checkpoint copies; compute: each block range per microbatch step, CUDA-event times on GPU; "
                      "send; receive; checkpoint writer; load in the background: the VAE, and the blocks while "
                      "their warm-up or the encoders run), every rank's clock aligned to rank 0's and merged by rank 0 "
                      "into this one file at the end of the run. CUDA builds also mark the same names as NVTX ranges "
                      "for Nsight Systems");
  generate.add_option("--torch-profile", options.torch_profile_path,
                      "write rank 0's first --torch-profile-steps denoising steps as recorded by LibTorch's own "
                      "profiler (Kineto), as Chrome trace-event JSON: the loop thread's ATen ops and compute spans "
                      "and, on CUDA, every kernel, copy and CUDA runtime call of the process with its stream. For "
                      "machines without Nsight Systems; bench/first_step_trace.py compares step 1 with step 2 in it");
  generate.add_option("--torch-profile-steps", options.torch_profile_steps,
                      "how many whole denoising steps --torch-profile records, from the first")
      ->check(CLI::Range(1, 1000000));
}

}  // namespace dp::cli
