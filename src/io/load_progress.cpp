#include "io/load_progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/error.h"
#include "core/human_units.h"
#include "core/log.h"

namespace dp::io {

LoadProgress::LoadProgress(std::string source, uint64_t total_bytes, double every_seconds, Sink sink)
    : source_(std::move(source)),
      total_bytes_(total_bytes),
      every_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(every_seconds))),
      sink_(std::move(sink)),
      started_(Clock::now()) {
  next_due_ = (started_ + every_).time_since_epoch().count();
}

void LoadProgress::add(uint64_t bytes) {
  const uint64_t done = done_.fetch_add(bytes) + bytes;
  if (every_.count() <= 0) return;
  const Clock::time_point now = Clock::now();
  Clock::rep due = next_due_.load();
  if (now.time_since_epoch().count() < due) return;
  // Several readers may find the line due at once: the one that moves the deadline writes it.
  if (!next_due_.compare_exchange_strong(due, (now + every_).time_since_epoch().count())) return;
  ++lines_;
  const std::string text = line(done, now);
  if (sink_) {
    sink_(text);
  } else {
    DP_INFO(text);
  }
}

void LoadProgress::waited(double seconds) {
  const auto ticks = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  waited_ += ticks.count();
  next_due_ = (Clock::now() + every_).time_since_epoch().count();
}

std::string LoadProgress::line(uint64_t done, Clock::time_point now) const {
  const double reading = std::max(
      std::chrono::duration<double>(now - started_ - Clock::duration(waited_.load())).count(), 1e-9);
  const double rate = static_cast<double>(done) / reading;  // bytes per second
  const uint64_t left = total_bytes_ > done ? total_bytes_ - done : 0;
  char figures[160];
  std::snprintf(figures, sizeof figures, "%.2f of %.2f GB read (%.0f%%) in %.1f s, %.2f GB/s", done / 1e9,
                total_bytes_ / 1e9, total_bytes_ > 0 ? 100.0 * done / total_bytes_ : 100.0, reading, rate / 1e9);
  return str("load ", source_, ": ", figures,
             rate > 0 ? str(", about ", human_seconds(static_cast<double>(left) / rate), " left") : std::string());
}

double LoadProgress::interval_from_environment() {
  const char* setting = std::getenv("DIFFPIPE_LOAD_PROGRESS_SECONDS");
  if (setting == nullptr) return 5.0;
  char* end = nullptr;
  const double seconds = std::strtod(setting, &end);
  DP_CHECK(end != setting && *end == '\0' && std::isfinite(seconds) && seconds >= 0,
           "DIFFPIPE_LOAD_PROGRESS_SECONDS must be a number of seconds >= 0 (0: no progress lines), got '", setting,
           "'");
  return seconds;
}

}  // namespace dp::io
