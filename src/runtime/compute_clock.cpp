#include "runtime/compute_clock.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <ATen/record_function.h>

#include <memory>
#include <thread>

#include "core/error.h"
#include "core/trace.h"
#include "runtime/ring.h"

namespace dp::runtime {
namespace {
// How long the trace's reference event may wait for work queued before the ring's first span.
[[maybe_unused]] constexpr int kReferenceWaitSeconds = 60;
}  // namespace

struct ComputeClock::Span {
  int step = -1;
  std::string name;
  int64_t host_start_us = 0;
  double host_seconds = 0;  // the CPU's span, known at end()
  // The same name as a user scope of LibTorch's profiler while --torch-profile records; null otherwise.
  std::unique_ptr<at::RecordFunction> annotation;
#ifdef DIFFPIPE_HAVE_CUDA
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Span() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
#endif
};

ComputeClock::ComputeClock(const at::Device& device) : device_(device) {}
ComputeClock::~ComputeClock() = default;

void ComputeClock::begin(const std::string& name) {
  open_ = std::make_unique<Span>();
  open_->name = name;
  trace::nvtx_push(name);
  if (at::hasCallbacks()) {  // a profiler is on somewhere: nothing is made for a span otherwise
    auto annotation = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (annotation->isActive()) {
      annotation->before(name);
      open_->annotation = std::move(annotation);
    }
  }
  host_started_ = std::chrono::steady_clock::now();
  open_->host_start_us = trace::now_us();
#ifdef DIFFPIPE_HAVE_CUDA
  if (on_device()) {
    c10::cuda::CUDAGuard guard(device_);  // events belong to the device that is current when they are made
    const auto stream = at::cuda::getCurrentCUDAStream(device_.index()).stream();
    if (trace::recording() && !reference_ && !reference_failed_) {
      // Once per clock, before its first span: the host waits for the device this one time, bounded; past the
      // bound the trace places device spans at their host start instead.
      auto reference = std::make_unique<Span>();
      DP_CHECK(cudaEventCreate(&reference->start) == cudaSuccess, "cannot create a CUDA event on ", device_.str());
      DP_CHECK(cudaEventRecord(reference->start, stream) == cudaSuccess, "cudaEventRecord failed on ", device_.str());
      const auto asked = std::chrono::steady_clock::now();
      cudaError_t state = cudaEventQuery(reference->start);
      while (state == cudaErrorNotReady &&
             std::chrono::steady_clock::now() - asked < std::chrono::seconds(kReferenceWaitSeconds))
        state = cudaEventQuery(reference->start);
      reference_us_ = trace::now_us();
      if (state == cudaSuccess) reference_ = std::move(reference);
      else reference_failed_ = true;
    }
    DP_CHECK(cudaEventCreate(&open_->start) == cudaSuccess && cudaEventCreate(&open_->stop) == cudaSuccess,
             "cannot create CUDA events to time compute on ", device_.str());
    DP_CHECK(cudaEventRecord(open_->start, stream) == cudaSuccess, "cudaEventRecord failed on ", device_.str());
  }
#endif
}

void ComputeClock::end(int step) {
  DP_CHECK(open_ != nullptr, "ComputeClock::end() without begin()");
  open_->step = step;
  open_->host_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - host_started_).count();
  trace::nvtx_pop();
  open_->annotation.reset();  // ends the profiler's scope
#ifdef DIFFPIPE_HAVE_CUDA
  if (on_device()) {
    c10::cuda::CUDAGuard guard(device_);
    DP_CHECK(cudaEventRecord(open_->stop, at::cuda::getCurrentCUDAStream(device_.index()).stream()) == cudaSuccess,
             "cudaEventRecord failed on ", device_.str());
  }
#endif
  pending_.push_back(std::move(open_));
}

void ComputeClock::collect(RankTimes& times, bool wait, double timeout_seconds) {
  [[maybe_unused]] const auto started = std::chrono::steady_clock::now();
  while (!pending_.empty()) {
    Span& span = *pending_.front();
    double seconds = span.host_seconds;
    int64_t start_us = span.host_start_us;
#ifdef DIFFPIPE_HAVE_CUDA
    if (on_device()) {
      const cudaError_t state = cudaEventQuery(span.stop);
      if (state == cudaErrorNotReady) {
        if (!wait) return;
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        DP_CHECK(waited < timeout_seconds, "the device work of step ", span.step + 1, " on ", device_.str(),
                 " did not finish within ", timeout_seconds, " s (--transport-timeout)");
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      DP_CHECK(state == cudaSuccess, "timing compute on ", device_.str(), ": ", cudaGetErrorString(state));
      float ms = 0;
      DP_CHECK(cudaEventElapsedTime(&ms, span.start, span.stop) == cudaSuccess, "cudaEventElapsedTime failed");
      seconds = ms / 1e3;
      float since_reference_ms = 0;
      if (reference_ && cudaEventElapsedTime(&since_reference_ms, reference_->start, span.start) == cudaSuccess)
        start_us = reference_us_ + static_cast<int64_t>(since_reference_ms * 1e3);
    }
#endif
    trace::complete(trace::Track::compute, span.name, start_us, static_cast<int64_t>(seconds * 1e6));
    times.compute_seconds += seconds;
    times.at_step(span.step).compute_seconds += seconds;
    pending_.pop_front();
  }
}

}  // namespace dp::runtime
