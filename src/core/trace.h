#pragma once
// generate --trace: a timeline of what each rank did, as Chrome trace-event JSON (Perfetto, chrome://tracing),
// and the same names as NVTX ranges on CUDA builds so that Nsight Systems shows them. Spans are recorded on the
// host's steady clock (the clock --report's host figures use); device work is placed on it by the caller
// (runtime/compute_clock.cpp converts CUDA event times). Recording is off unless start() was called; NVTX ranges
// are emitted whenever the build has NVTX, at the cost of a push and a pop (nothing without a profiler).
#include <cstdint>
#include <string>

namespace dp::trace {

// The streams of a rank, one track each (the trace-event "tid").
enum class Track : int {
  host = 1,
  compute = 2,
  send = 3,
  receive = 4,
  checkpoint = 5,
  device_send = 6,
  device_receive = 7,
  background_load = 8,  // weights loaded on a thread of their own while the host track goes on (the VAE; a
                        // rank's blocks beside their warm-up or, with --load-overlap on, beside the encoders)
};
const char* track_name(Track track);

void start();  // from now on, spans of this process are kept
bool recording();
// Microseconds on this process's steady clock.
int64_t now_us();
// One finished span; ignored unless recording.
void complete(Track track, const std::string& name, int64_t start_us, int64_t duration_us);
// The spans kept so far, as a JSON array of {"track", "name", "ts", "dur"} (local clock), and forgets them.
std::string take_spans_json();

// An NVTX range on this thread (no-op without NVTX).
void nvtx_push(const std::string& name);
void nvtx_pop();

// A span of host work: an NVTX range while it lasts, a trace event when it ends (also when it ends by an
// exception: the timeline then shows how far it got).
class Scope {
 public:
  Scope(Track track, std::string name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Track track_;
  std::string name_;
  int64_t started_us_;
};

}  // namespace dp::trace
