#pragma once
// Times one stage of a run (encode, denoise, decode) and records a StageReport: wall seconds with device work
// synchronised, the part spent loading weights, peak RSS and peak device memory. Its parts are logged as they
// finish, so a slow stage shows where its time goes.
#include <ATen/ATen.h>

#include <chrono>
#include <exception>
#include <iomanip>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/human_units.h"
#include "core/memory_stats.h"
#include "core/trace.h"
#include "pipeline/device_stats.h"
#include "pipeline/flux_pipeline.h"

namespace dp::pipeline {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class StageTimer {
 public:
  StageTimer(std::string name, const at::Device& device, std::vector<StageReport>* reports)
      : device_(device), reports_(reports), started_(std::chrono::steady_clock::now()),
        uncaught_at_start_(std::uncaught_exceptions()) {
    report_.name = std::move(name);
    reset_peak_resident();
    reset_peak_memory(device_);  // the process's first CUDA call lands here: context, allocator
    const double ready = seconds_since(started_);
    if (ready > 0.05)
      DP_INFO("stage ", report_.name, ": device ready after ", std::fixed, std::setprecision(3), ready,
              " s (its first use initialises it)");
  }
  // Never throws: it runs while an error unwinds the stage, and a second exception then would end the
  // process in std::terminate. A stage left by an exception is logged as failed, with no figures that could
  // pass for a result, and gets no report.
  ~StageTimer() {
    try {
      finish();
    } catch (...) {
      // Logging itself failed (out of memory): nothing more can be said without risking std::terminate.
    }
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

  // Runs `work` to completion on the device and logs how long it took, so a slow stage shows which part;
  // the time is also added to `*booked` when given.
  template <typename Work>
  auto timed(const char* what, Work&& work, double* booked = nullptr) {
    const auto started = std::chrono::steady_clock::now();
    trace::Scope span(trace::Track::host, str(report_.name, ": ", what));  // --trace and NVTX
    auto result = work();
    synchronize(device_);
    const double seconds = seconds_since(started);
    if (booked != nullptr) *booked += seconds;
    DP_INFO("stage ", report_.name, ": ", what, " ", human_seconds(seconds));
    return result;
  }

  // timed() for a component's from-folder constructor: its time, device copies included, is booked as
  // loading rather than compute.
  template <typename Load>
  auto loading(const char* what, Load&& load) {
    return timed(what, std::forward<Load>(load), &report_.load_seconds);
  }

 private:
  void finish() {
    const double seconds = seconds_since(started_);
    if (std::uncaught_exceptions() > uncaught_at_start_) {
      DP_WARN("stage ", report_.name, " failed after ", human_seconds(seconds));
      return;
    }
    try {
      synchronize(device_);  // queued device work belongs to this stage's time (and may report its error)
    } catch (const std::exception& e) {
      const std::string what = e.what();  // a c10::Error's first line; its backtrace follows
      DP_ERROR("stage ", report_.name, " failed after ", human_seconds(seconds),
               ": waiting for the device failed: ", what.substr(0, what.find('\n')));
      return;
    }
    report_.seconds = seconds_since(started_);
    report_.peak_resident_bytes = peak_resident_bytes();
    report_.peak_device_bytes = device_.is_cuda() ? peak_memory_bytes(device_) : 0;
    DP_INFO("stage ", report_.name, ": ", human_seconds(report_.seconds), " (loading weights ",
            human_seconds(report_.load_seconds), "), peak RSS ", human_size(report_.peak_resident_bytes),
            device_.is_cuda() ? str(", peak device ", human_size(report_.peak_device_bytes)) : std::string());
    reports_->push_back(report_);
  }

  at::Device device_;
  std::vector<StageReport>* reports_;
  std::chrono::steady_clock::time_point started_;
  int uncaught_at_start_;  // std::uncaught_exceptions() at construction: more at destruction means unwinding
  StageReport report_;
};

}  // namespace dp::pipeline
