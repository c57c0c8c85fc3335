// The process clock (core/process_clock.h) against a clock of the test's own: what the startup figure rests on.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/process_clock.h"

namespace dp {
namespace {

TEST(ProcessClock, AgeIsPositiveAndGrowsWithTime) {
  const double first = process_age_seconds();
  ASSERT_GE(first, 0.0) << "/proc/self/stat or CLOCK_BOOTTIME unreadable";
  // A test binary is seconds old at most when its first test runs, not hours (a wrong field gives boot time).
  EXPECT_LT(first, 600.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  const double later = process_age_seconds();
  // The start is fixed, so the age moves with the wall clock (here at 10 ms tick resolution, and a busy machine
  // may sleep longer than asked).
  EXPECT_GE(later - first, 0.11);
  EXPECT_LT(later - first, 60.0);
}

TEST(ProcessClock, MainEntryIsUnmarkedUntilMarked) {
  EXPECT_LT(age_at_main_seconds(), 0.0);
  mark_main_entered();
  const double at_main = age_at_main_seconds();
  EXPECT_GE(at_main, 0.0);
  EXPECT_LE(at_main, process_age_seconds());
}

}  // namespace
}  // namespace dp
