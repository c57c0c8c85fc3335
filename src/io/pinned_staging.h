#pragma once
// The CUDA readers' staging chunks (two per reader, io/parallel_load.h) pinned one at a time on a thread of their
// own and handed to readers as they come. Pinning costs about 0.8 ms a megabyte (213 ms for the 256 MB of 16
// readers on an H100, bench/first_use.py), and the first load of a run (CLIP's 0.25 GB) started before it was done
// and waited about 85 ms for all of it (bench/RESULTS.md, 2026-12-05, session 4). From here a reader starts as
// soon as two chunks are pinned; one that gets none before its load's work is all taken does nothing.
//
// Opt-in (DIFFPIPE_PROGRESSIVE_STAGING=1, io/parallel_load.cpp): on an H100 whose pinning took 75 ms it gained
// nothing from command to PNG (bench/RESULTS.md, 2026-12-05, session 4); it is for hosts that pin slowly.
// Device-agnostic: the pinning is a function (cudaHostAlloc on CUDA), so that the tests run it on the CPU.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dp::io {

class StagingChunks {
 public:
  using Pin = std::function<void*(std::size_t bytes)>;  // one chunk of pinned memory, or throws
  using Unpin = std::function<void(void*)>;

  // Starts pinning `count` chunks of `bytes` on a thread.
  StagingChunks(std::size_t bytes, int count, Pin pin, Unpin unpin);
  // Waits for the pinning thread, then unpins the chunks that are back (none is out at a process's end).
  ~StagingChunks();
  StagingChunks(const StagingChunks&) = delete;
  StagingChunks& operator=(const StagingChunks&) = delete;

  std::size_t chunk_bytes() const { return bytes_; }

  // `n` chunks for a reader, all at once (a reader holding one while waiting for another could starve the rest).
  // Waits while chunks are still being pinned, and returns none, for the caller to pin its own or to stop, when:
  //   - `give_up()` says so (checked every few milliseconds: its load's work is all taken, or it failed);
  //   - every chunk is pinned and fewer than `n` are free (another load holds them);
  //   - `timeout` passes.
  std::vector<void*> take(int n, const std::function<bool()>& give_up, std::chrono::milliseconds timeout);
  void give_back(const std::vector<void*>& chunks);

  struct Progress {
    int pinned = 0;
    int count = 0;
    bool finished = false;  // every chunk pinned, or the pinning stopped at `error`
    double seconds = 0;     // the pinning's time, once finished
    std::string error;
  };
  Progress progress() const;

 private:
  void pin_all(Pin pin);

  const std::size_t bytes_;
  const int count_;
  Unpin unpin_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<void*> free_;
  int pinned_ = 0;
  bool finished_ = false;
  double seconds_ = 0;
  std::string error_;
  std::thread pinning_;  // last: started once the rest is built
};

}  // namespace dp::io
