#pragma once
// Progress lines for a load that takes long: from a cold page cache a component is read off the disk, and at
// 1 GB/s FLUX.1-dev's transformer takes 24 s with nothing else to say. Every `every` seconds one line gives the
// bytes read so far, the rate and the time left. The readers of a load (io/parallel_load.cpp) call add() after
// each piece, from any thread, and whichever finds a line due writes it; a load faster than `every` writes
// none. No LibTorch here.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace dp::io {

class LoadProgress {
 public:
  using Clock = std::chrono::steady_clock;
  // Receives each line; the default logs it at info level.
  using Sink = std::function<void(const std::string&)>;

  // `source` names the load in each line (the component folder); `every_seconds` 0 writes no line.
  LoadProgress(std::string source, uint64_t total_bytes, double every_seconds, Sink sink = {});

  // `bytes` more read (a reader's piece); writes a line when one is due.
  void add(uint64_t bytes);
  // Time the load spent waiting rather than reading (for a load budget's lift): left out of the rate, and the
  // next line is due `every` seconds after the wait.
  void waited(double seconds);

  uint64_t bytes_done() const { return done_.load(); }
  int lines() const { return lines_.load(); }

  // DIFFPIPE_LOAD_PROGRESS_SECONDS: seconds between lines, 0 for none; 5 when unset. Anything but a finite
  // number >= 0 is an error naming the variable.
  static double interval_from_environment();

 private:
  std::string line(uint64_t done, Clock::time_point now) const;

  const std::string source_;
  const uint64_t total_bytes_;
  const Clock::duration every_;
  const Sink sink_;
  const Clock::time_point started_;
  std::atomic<uint64_t> done_{0};
  std::atomic<Clock::rep> waited_{0};    // Clock ticks spent waiting
  std::atomic<Clock::rep> next_due_{0};  // Clock ticks since the epoch; one reader wins each
  std::atomic<int> lines_{0};
};

}  // namespace dp::io
