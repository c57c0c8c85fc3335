#pragma once
// The NaN/Inf guard of the denoising loop: NaN weights or a non-finite input give an all-black image with
// exit 0 unless someone looks, so the latents are checked after every step (LoopCallbacks::check_step) and
// the error names where they went bad. One reduction and one bool copied to the host per step.
#include <ATen/ATen.h>

#include <string>

namespace dp::pipeline {

// Where in a run a tensor was computed. The one-process pipeline fills the step; the multi-rank runtime adds
// which rank and which transformer blocks produced it, and every message names all of it.
struct RunSite {
  int step = 0;  // 1-based
  int steps = 0;
  std::string placement;  // "" in one process; e.g. "rank 2, blocks [19, 38)"
  std::string describe() const;  // "denoising step 3/28" (+ ", rank 2, blocks [19, 38)")
};

// True when every value is finite (no NaN, no +-Inf).
bool all_finite(const at::Tensor& values);

// Throws a dp::Error naming `site` unless `latents` (a step's result, after the Euler update) are all finite.
void check_step_latents(const at::Tensor& latents, const RunSite& site);

}  // namespace dp::pipeline
