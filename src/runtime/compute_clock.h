#pragma once
// Times the work a rank queues on its device. On CUDA the work runs after the host has queued it, so host time
// measures the queueing: there each span is a pair of CUDA events on the compute stream, read once both have
// fired, when the results are consumed anyway, never by synchronising the device each step. On the CPU the host
// clock is the device clock.
#include <ATen/ATen.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>

namespace dp::runtime {

struct RankTimes;

class ComputeClock {
 public:
  explicit ComputeClock(const at::Device& device);
  ~ComputeClock();
  ComputeClock(const ComputeClock&) = delete;
  ComputeClock& operator=(const ComputeClock&) = delete;

  bool on_device() const { return device_.is_cuda(); }
  // Around the work of one microbatch step on the current stream. `name` labels the span in --trace and as
  // an NVTX range (core/trace.h).
  void begin(const std::string& name = "compute");
  void end(int step);
  // Adds the spans that have finished to `times` (compute seconds, in total and per step). With `wait`, first
  // waits for every span, at most `timeout_seconds` (the work queued before is finished or failed by then).
  void collect(RankTimes& times, bool wait, double timeout_seconds);

 private:
  struct Span;
  at::Device device_;
  std::chrono::steady_clock::time_point host_started_;
  std::unique_ptr<Span> open_;
  // CUDA: an event the host saw complete at reference_us_ (steady clock), to place device spans on the host's
  // timeline for --trace. Made at the first span.
  std::unique_ptr<Span> reference_;
  int64_t reference_us_ = 0;
  bool reference_failed_ = false;
  std::deque<std::unique_ptr<Span>> pending_;
};

}  // namespace dp::runtime
