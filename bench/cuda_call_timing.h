#pragma once
// The timing the CUDA benches share: the mean host-clock seconds of one call, the stream drained before and after.
#include <ATen/cuda/CUDAContext.h>

#include <chrono>
#include <functional>

namespace dp::bench {

// Mean seconds of one call over `repeats`, after two unmeasured calls (first use: handles, heuristics, modules).
inline double seconds_per_call(const std::function<void()>& call, int repeats) {
  call();
  call();
  at::cuda::getCurrentCUDAStream().synchronize();
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) call();
  at::cuda::getCurrentCUDAStream().synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() / repeats;
}

}  // namespace dp::bench
