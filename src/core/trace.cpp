#include "core/trace.h"
#include "core/trace_clock.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#ifdef DIFFPIPE_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace dp::trace {
namespace {

struct Span {
  Track track;
  std::string name;
  int64_t start_us, duration_us;
};

std::atomic<bool> recording_{false};
std::mutex spans_mutex;  // the decode worker thread records beside the ring's
std::vector<Span> spans;

}  // namespace

const char* track_name(Track track) {
  switch (track) {
    case Track::host: return "host (load, encode, checkpoint, decode)";
    case Track::compute: return "compute (block ranges per microbatch step)";
    case Track::send: return "send";
    case Track::receive: return "receive";
    case Track::checkpoint: return "checkpoint writer";
    case Track::device_send: return "send on the device (NCCL)";
    case Track::device_receive: return "receive on the device (NCCL)";
    case Track::background_load:
      return "load in the background (the VAE; the blocks beside their warm-up or the encoders)";
  }
  return "other";
}

void start() { recording_ = true; }
bool recording() { return recording_; }

namespace {

double clock_skew_us() {
  const char* skews = std::getenv("DIFFPIPE_TRACE_CLOCK_SKEW_US");
  if (skews == nullptr) return 0;
  const char* rank_text = nullptr;
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if ((rank_text = std::getenv(name)) != nullptr) break;
  const long rank = rank_text ? std::strtol(rank_text, nullptr, 10) : 0;
  std::string list = skews;
  for (long r = 0; r < rank && list.find(',') != std::string::npos; ++r) list = list.substr(list.find(',') + 1);
  return std::strtod(list.c_str(), nullptr);
}

}  // namespace

double now_us_fine() {
  static const double skew = clock_skew_us();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count() + skew;
}

int64_t now_us() { return static_cast<int64_t>(now_us_fine()); }

void complete(Track track, const std::string& name, int64_t start_us, int64_t duration_us) {
  if (!recording_) return;
  std::lock_guard<std::mutex> lock(spans_mutex);
  spans.push_back({track, name, start_us, duration_us < 0 ? 0 : duration_us});
}

std::string take_spans_json() {
  std::vector<Span> taken;
  {
    std::lock_guard<std::mutex> lock(spans_mutex);
    taken.swap(spans);
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : taken)
    out.push_back({{"track", static_cast<int>(s.track)}, {"name", s.name}, {"ts", s.start_us}, {"dur", s.duration_us}});
  return out.dump();
}

void nvtx_push([[maybe_unused]] const std::string& name) {
#ifdef DIFFPIPE_HAVE_NVTX
  nvtxRangePushA(name.c_str());
#endif
}

void nvtx_pop() {
#ifdef DIFFPIPE_HAVE_NVTX
  nvtxRangePop();
#endif
}

Scope::Scope(Track track, std::string name) : track_(track), name_(std::move(name)), started_us_(now_us()) {
  nvtx_push(name_);
}

Scope::~Scope() {
  nvtx_pop();
  try {
    complete(track_, name_, started_us_, now_us() - started_us_);
  } catch (...) {
    // Out of memory while unwinding: the span is lost rather than the process.
  }
}

}  // namespace dp::trace
