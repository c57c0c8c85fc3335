#pragma once
// Times the work a rank queues on its device. On CUDA the work runs after the host has queued it, so host time
// measures the queueing: there each span is a pair of CUDA events on the compute stream, read once both have
// fired, when the results are consumed anyway, never by synchronising the device each step. On the CPU the host
// clock is the device clock.
#include <ATen/ATen.h>

#include <chrono>
#include <deque>
#include <memory>

namespace dp::runtime {

struct RankTimes;

class ComputeClock {
 public:
  explicit ComputeClock(const at::Device& device);
  ~ComputeClock();
  ComputeClock(const ComputeClock&) = delete;
  ComputeClock& operator=(const ComputeClock&) = delete;

  bool on_device() const { return device_.is_cuda(); }
  // Around the work of one microbatch step on the current stream.
  void begin();
  void end(int step);
  // Adds the spans that have finished to `times` (compute seconds, in total and per step). With `wait`, first
  // waits for every span, at most `timeout_seconds` (the work queued before is finished or failed by then).
  void collect(RankTimes& times, bool wait, double timeout_seconds);

 private:
  struct Span;
  at::Device device_;
  std::chrono::steady_clock::time_point host_started_;
  std::unique_ptr<Span> open_;
  std::deque<std::unique_ptr<Span>> pending_;
};

}  // namespace dp::runtime
