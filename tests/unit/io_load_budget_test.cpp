// The load budget (io/load_budget.h): the early allowance is counted and enforced, a waiter wakes when another
// thread lifts it and not before, a wait that outlasts its bound fails naming what it waited for, and the budget
// a thread installs is seen by that thread only.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "io/load_budget.h"

namespace dp::io {
namespace {

using std::chrono::milliseconds;

TEST(LoadBudget, CountsTheEarlyAllowanceAndRefusesMore) {
  LoadBudget budget(1000, "the encoders to finish", milliseconds(1000));
  EXPECT_EQ(budget.room(), 1000u);
  budget.take(600);
  EXPECT_EQ(budget.room(), 400u);
  EXPECT_EQ(budget.taken_early(), 600u);
  try {
    budget.take(401);
    FAIL() << "took more than the room left";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the encoders to finish"), std::string::npos) << e.what();
  }
  budget.lift();
  EXPECT_TRUE(budget.lifted());
  EXPECT_EQ(budget.room(), LoadBudget::kUnlimited);
  budget.take(uint64_t{1} << 40);  // no limit once lifted, and not counted as early
  EXPECT_EQ(budget.taken_early(), 600u);
  budget.lift();  // idempotent
  EXPECT_LT(budget.wait_for_lift(), 0.1);
}

TEST(LoadBudget, AWaiterWakesWhenAnotherThreadLifts) {
  LoadBudget budget(0, "the encoders to finish", milliseconds(20000));
  double waited = -1;
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    waited = budget.wait_for_lift();
    returned = true;
  });
  // Held 200 ms from when the waiter is seen blocked, so the wait it reports lasts at least that long however
  // late its thread starts on a busy machine.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (budget.waiters() == 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(1));
  EXPECT_EQ(budget.waiters(), 1);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(returned) << "the wait returned before the lift";
  budget.lift();
  waiter.join();
  EXPECT_TRUE(returned);
  EXPECT_EQ(budget.waiters(), 0);
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 15.0);
}

TEST(LoadBudget, AWaitIsBoundedAndSaysWhatItWaitedFor) {
  LoadBudget budget(4096, "the text encoders to release the device", milliseconds(150));
  budget.take(1024);
  const auto started = std::chrono::steady_clock::now();
  try {
    budget.wait_for_lift();
    FAIL() << "the wait did not time out";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("waited 0.15 s for the text encoders to release the device"), std::string::npos) << message;
    EXPECT_NE(message.find("loaded early"), std::string::npos) << message;
  }
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(140));
  EXPECT_THROW(LoadBudget(0, "x", milliseconds(0)), Error);
}

TEST(LoadBudget, AnInstalledBudgetBelongsToItsThreadAndScopesNest) {
  LoadBudget outer(1, "a", milliseconds(1000));
  LoadBudget inner(2, "b", milliseconds(1000));
  EXPECT_EQ(current_load_budget(), nullptr);
  {
    const ScopedLoadBudget first(&outer);
    EXPECT_EQ(current_load_budget(), &outer);
    LoadBudget* seen_elsewhere = &inner;
    std::thread([&] { seen_elsewhere = current_load_budget(); }).join();
    EXPECT_EQ(seen_elsewhere, nullptr) << "another thread's loads are not limited";
    {
      const ScopedLoadBudget second(&inner);
      EXPECT_EQ(current_load_budget(), &inner);
    }
    EXPECT_EQ(current_load_budget(), &outer);
  }
  EXPECT_EQ(current_load_budget(), nullptr);
}

}  // namespace
}  // namespace dp::io
