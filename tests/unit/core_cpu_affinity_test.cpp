// The CPU counts (core/cpu_affinity.h) against the kernel's own affinity calls, on a thread the test binds.
#include <gtest/gtest.h>

#include <thread>

#include "bind_one_cpu.h"
#include "core/cpu_affinity.h"

namespace dp {
namespace {

TEST(CpuAffinity, CountsArePositiveAndTheMaskIsWithinTheMachine) {
  EXPECT_GE(machine_cpus(), 1);
  EXPECT_GE(usable_cpus(), 1);
  EXPECT_LE(usable_cpus(), machine_cpus());
}

// A thread bound to one CPU, as Open MPI binds a rank, counts one; a thread it starts inherits the mask; the
// process's other threads keep theirs.
TEST(CpuAffinity, AThreadBoundToOneCpuCountsOneAndItsThreadsInheritIt) {
  const int before = usable_cpus();
  int bound = 0;
  int inherited = 0;
  std::thread worker([&] {
    ASSERT_GE(test::bind_this_thread_to_one_cpu(), 0);
    bound = usable_cpus();
    std::thread child([&] { inherited = usable_cpus(); });
    child.join();
  });
  worker.join();
  EXPECT_EQ(bound, 1);
  EXPECT_EQ(inherited, 1);
  EXPECT_EQ(usable_cpus(), before) << "binding another thread changed this one's mask";
}

}  // namespace
}  // namespace dp
