// The progressive staging chunks (io/pinned_staging.h) with a stand-in for the pinning whose every chunk waits
// for the test's go: readers get chunks as they are pinned, give up when their load's work is taken, fall back
// when every chunk is pinned and out, and a failed pin stops the pinning without stranding anyone.
#include "io/pinned_staging.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <stdexcept>

namespace {

using namespace std::chrono_literals;

// Pins (mallocs) one chunk each time the test allows one; `fail_at` makes that chunk's pinning throw.
class GatedPin {
 public:
  void allow(int chunks) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      allowed_ += chunks;
    }
    changed_.notify_all();
  }
  dp::io::StagingChunks::Pin function(int fail_at = -1) {
    return [this, fail_at](std::size_t bytes) -> void* {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return allowed_ > started_; });
      if (started_++ == fail_at) throw std::runtime_error("cudaHostAlloc failed: out of memory");
      return std::malloc(bytes);
    };
  }
  static void unpin(void* chunk) { std::free(chunk); }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int allowed_ = 0;
  int started_ = 0;
};

// Waits (bounded) until `pinned` chunks are pinned.
void wait_for_pinned(const dp::io::StagingChunks& chunks, int pinned) {
  for (int i = 0; i < 5000 && chunks.progress().pinned < pinned; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_GE(chunks.progress().pinned, pinned);
}

TEST(StagingChunks, AReaderStartsOnceItsTwoChunksArePinnedNotAllOfThem) {
  GatedPin gate;
  dp::io::StagingChunks chunks(4096, 8, gate.function(), GatedPin::unpin);
  gate.allow(2);
  const auto two = chunks.take(2, nullptr, 10s);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_NE(two[0], two[1]);
  EXPECT_FALSE(chunks.progress().finished);
  EXPECT_EQ(chunks.chunk_bytes(), 4096u);
  // A second reader waits for the next two.
  auto second = std::async(std::launch::async, [&] { return chunks.take(2, nullptr, 10s); });
  EXPECT_EQ(second.wait_for(50ms), std::future_status::timeout);
  gate.allow(2);
  EXPECT_EQ(second.get().size(), 2u);
  gate.allow(4);
  wait_for_pinned(chunks, 8);
  chunks.give_back(two);
}

TEST(StagingChunks, AWaitingReaderGivesUpWhenItsLoadsWorkIsTaken) {
  GatedPin gate;
  dp::io::StagingChunks chunks(4096, 4, gate.function(), GatedPin::unpin);
  std::atomic<bool> work_left{true};
  auto waiting = std::async(std::launch::async, [&] { return chunks.take(2, [&] { return !work_left.load(); }, 10s); });
  EXPECT_EQ(waiting.wait_for(50ms), std::future_status::timeout);
  work_left = false;
  EXPECT_TRUE(waiting.get().empty());
  gate.allow(4);  // lets the pinning thread finish, for the destructor
}

TEST(StagingChunks, WithEveryChunkPinnedAndOutTheReaderPinsItsOwn) {
  GatedPin gate;
  gate.allow(2);
  dp::io::StagingChunks chunks(4096, 2, gate.function(), GatedPin::unpin);
  const auto held = chunks.take(2, nullptr, 10s);
  ASSERT_EQ(held.size(), 2u);
  wait_for_pinned(chunks, 2);
  for (int i = 0; i < 5000 && !chunks.progress().finished; ++i) std::this_thread::sleep_for(1ms);
  // Another load's reader: nothing more will be pinned, so it is told at once rather than after the timeout.
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(chunks.take(2, nullptr, 10s).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  chunks.give_back(held);
  EXPECT_EQ(chunks.take(2, nullptr, 10s).size(), 2u);
}

TEST(StagingChunks, AFailedPinEndsThePinningAndSaysWhy) {
  GatedPin gate;
  dp::io::StagingChunks chunks(4096, 6, gate.function(/*fail_at=*/3), GatedPin::unpin);
  auto waiting = std::async(std::launch::async, [&] {
    std::vector<std::vector<void*>> got;
    for (int i = 0; i < 2; ++i) got.push_back(chunks.take(2, nullptr, 10s));
    return got;
  });
  gate.allow(6);
  const auto got = waiting.get();
  EXPECT_EQ(got[0].size(), 2u);
  EXPECT_TRUE(got[1].empty());  // one chunk was pinned after the first two, then the fourth failed
  const auto progress = chunks.progress();
  EXPECT_TRUE(progress.finished);
  EXPECT_EQ(progress.pinned, 3);
  EXPECT_NE(progress.error.find("out of memory"), std::string::npos) << progress.error;
  chunks.give_back(got[0]);
}

TEST(StagingChunks, TheTimeoutBoundsTheWait) {
  GatedPin gate;
  dp::io::StagingChunks chunks(4096, 2, gate.function(), GatedPin::unpin);
  EXPECT_TRUE(chunks.take(2, nullptr, 20ms).empty());
  gate.allow(2);
}

}  // namespace
