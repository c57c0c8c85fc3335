#pragma once
// --torch-profile FILE: rank 0's first denoising steps recorded by LibTorch's own profiler (Kineto) and written as
// Chrome trace-event JSON: the ATen ops of the loop's thread, the compute spans' names (the same as --trace's and
// the NVTX ranges'), and on CUDA every kernel, copy and CUDA runtime call of the process, with their streams. It
// answers what --trace cannot (which kernels a step ran, and where the host waited) on machines without Nsight
// Systems; bench/first_step_trace.py compares step 1 with step 2 in it.
#include <ATen/Device.h>

#include <memory>
#include <string>

namespace dp::runtime {

class StepProfile {
 public:
  // Inactive when `path` is empty. Records the first `steps` whole steps of the loop (every microbatch's).
  StepProfile(std::string path, int steps, const at::Device& device);
  ~StepProfile();  // a profile still running (the loop failed) is stopped, not written
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;

  bool active() const { return !path_.empty(); }
  // On the loop's thread (LibTorch records the ops of the thread that starts it), just before the loop.
  void start();
  // After each whole step: at `steps` the profile stops and is written.
  void after_step(int step);
  // After the loop: writes the profile if the loop had fewer steps than asked.
  void finish();

 private:
  void stop_and_write();
  std::string path_;
  int steps_ = 0;
  at::Device device_;
  bool running_ = false;
};

}  // namespace dp::runtime
