#pragma once
// How much device memory a load may fill before something else lets go of its own. The transformer's blocks load
// while the text encoders still hold theirs (--load-overlap); blocks and encoders together must stay within what
// the staged order peaks at, so the loader gets an early allowance and waits for the rest until the encoders are
// released (runtime/load_phase.cpp sizes the allowance and lifts it). load_parallel asks the budget installed on
// its thread before it allocates each portion of a component's tensors. No LibTorch here: plain bookkeeping.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>

namespace dp::io {

class LoadBudget {
 public:
  static constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

  // `early_bytes` may be held before lift(); `awaited` names what lifts it, for logs and the timeout's error
  // ("the text encoders release the device"); a wait longer than `lift_timeout` fails rather than hang.
  LoadBudget(uint64_t early_bytes, std::string awaited, std::chrono::milliseconds lift_timeout);

  // What a load may still allocate now: the early allowance not yet taken, or kUnlimited once lifted.
  uint64_t room() const;
  // Counts `bytes` against the early allowance (nothing once lifted). Throws when they do not fit in room().
  void take(uint64_t bytes);
  // Blocks until lift(), at most the timeout (then throws, naming what it waited for). Returns the seconds waited.
  double wait_for_lift() const;
  // No limit from now on; wakes the waiters. Idempotent.
  void lift();

  bool lifted() const;
  // How many loads are blocked in wait_for_lift() now: what lifts the budget can tell a load that waits from one
  // still reading its early part (tests hold the lift for a known time after the wait began).
  int waiters() const;
  uint64_t early_bytes() const { return early_bytes_; }
  uint64_t taken_early() const;  // bytes taken before the lift
  const std::string& awaited() const { return awaited_; }

 private:
  const uint64_t early_bytes_;
  const std::string awaited_;
  const std::chrono::milliseconds lift_timeout_;
  mutable std::mutex mutex_;
  mutable std::condition_variable lifted_signal_;
  uint64_t taken_ = 0;
  mutable int waiters_ = 0;
  bool lifted_ = false;
};

// Installs `budget` for the loads this thread starts while the scope lives (null: none); scopes nest.
class ScopedLoadBudget {
 public:
  explicit ScopedLoadBudget(LoadBudget* budget);
  ~ScopedLoadBudget();
  ScopedLoadBudget(const ScopedLoadBudget&) = delete;
  ScopedLoadBudget& operator=(const ScopedLoadBudget&) = delete;

 private:
  LoadBudget* previous_;
};

// The budget installed on this thread, or null: loads on other threads (the encoders') are not limited.
LoadBudget* current_load_budget();

}  // namespace dp::io
