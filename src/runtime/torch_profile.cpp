#include "runtime/torch_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <chrono>
#include <set>

#include "core/error.h"
#include "core/human_units.h"
#include "core/log.h"

namespace dp::runtime {
namespace {

namespace impl = torch::profiler::impl;

// Op names only: input shapes, memory events and stacks would multiply the file for what a step comparison needs.
impl::ProfilerConfig profiler_config() { return impl::ProfilerConfig(impl::ProfilerState::KINETO); }

std::set<impl::ActivityType> activities(const at::Device& device) {
  std::set<impl::ActivityType> kinds{impl::ActivityType::CPU};
  if (device.is_cuda()) kinds.insert(impl::ActivityType::CUDA);
  return kinds;
}

}  // namespace

StepProfile::StepProfile(std::string path, int steps, const at::Device& device)
    : path_(std::move(path)), steps_(steps), device_(device) {
  DP_CHECK(path_.empty() || steps_ >= 1, "--torch-profile-steps must be at least 1, got ", steps_);
}

StepProfile::~StepProfile() {
  if (!running_) return;
  try {
    (void)torch::autograd::profiler::disableProfiler();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor after a failure; the failure is what is reported
  }
}

void StepProfile::start() {
  if (path_.empty() || running_) return;
  const auto config = profiler_config();
  torch::autograd::profiler::prepareProfiler(config, activities(device_));
  torch::autograd::profiler::enableProfiler(config, activities(device_));
  running_ = true;
  DP_INFO("rank 0: LibTorch's profiler records the first ", steps_, " denoising step(s) for --torch-profile ", path_,
          device_.is_cuda() ? " (ops, CUDA kernels, copies and runtime calls)" : " (ops)");
}

void StepProfile::after_step(int step) {
  if (running_ && step >= steps_) stop_and_write();
}

void StepProfile::finish() {
  if (running_) stop_and_write();
}

void StepProfile::stop_and_write() {
  running_ = false;
  const auto started = std::chrono::steady_clock::now();
  const auto result = torch::autograd::profiler::disableProfiler();
  DP_CHECK(result != nullptr, "--torch-profile: LibTorch's profiler returned no result");
  result->save(path_);
  DP_INFO("wrote --torch-profile ", path_, " (", result->events().size(), " events, written in ",
          human_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()),
          "; open it in https://ui.perfetto.dev, or compare steps with bench/first_step_trace.py)");
}

}  // namespace dp::runtime
