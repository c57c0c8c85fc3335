#include "io/pinned_staging.h"

#include <exception>

#include "core/human_units.h"
#include "core/log.h"

namespace dp::io {

StagingChunks::StagingChunks(std::size_t bytes, int count, Pin pin, Unpin unpin)
    : bytes_(bytes),
      count_(count),
      unpin_(std::move(unpin)),
      pinning_([this, pin = std::move(pin)] { pin_all(pin); }) {}

StagingChunks::~StagingChunks() {
  if (pinning_.joinable()) pinning_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  if (unpin_)
    for (void* chunk : free_) unpin_(chunk);
}

void StagingChunks::pin_all(Pin pin) {
  const auto started = std::chrono::steady_clock::now();
  std::string error;
  for (int i = 0; i < count_; ++i) {
    void* chunk = nullptr;
    try {
      chunk = pin(bytes_);
    } catch (const std::exception& e) {
      error = e.what();
      break;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.push_back(chunk);
      ++pinned_;
    }
    changed_.notify_all();
  }
  int pinned = 0;
  double seconds = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    error_ = error;
    seconds = seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    pinned = pinned_;
  }
  changed_.notify_all();
  if (error.empty()) {
    DP_DEBUG("load: pinned ", pinned, " staging chunks of ", human_size(static_cast<double>(bytes_)),
             " one at a time in ", human_seconds(seconds), ", each handed out as it came");
  } else {
    DP_WARN("load: pinning staging chunks stopped after ", pinned, " of ", count_, " (", error,
            "); readers without any pin their own");
  }
}

std::vector<void*> StagingChunks::take(int n, const std::function<bool()>& give_up, std::chrono::milliseconds timeout) {
  // give_up() reads the caller's state, which changes without a notification here: checked in short slices.
  constexpr auto kSlice = std::chrono::milliseconds(2);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (static_cast<int>(free_.size()) >= n) {
      std::vector<void*> out(free_.end() - n, free_.end());
      free_.resize(free_.size() - static_cast<std::size_t>(n));
      return out;
    }
    if (finished_ || (give_up && give_up()) || std::chrono::steady_clock::now() >= deadline) return {};
    changed_.wait_for(lock, kSlice);
  }
}

void StagingChunks::give_back(const std::vector<void*>& chunks) {
  if (chunks.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.insert(free_.end(), chunks.begin(), chunks.end());
  }
  changed_.notify_all();
}

StagingChunks::Progress StagingChunks::progress() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {pinned_, count_, finished_, seconds_, error_};
}

}  // namespace dp::io
