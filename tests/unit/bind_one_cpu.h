#pragma once
// Binds the calling thread to the first CPU of its affinity mask, as Open MPI binds a rank to one core; threads
// it starts afterwards inherit that. Header-only: torch-free suites and the loader's tests both use it.
#include <sched.h>

namespace dp::test {

// The CPU it was bound to, or -1 when the kernel refused.
inline int bind_this_thread_to_one_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &set)) ++first;
  if (first == CPU_SETSIZE) return -1;
  CPU_ZERO(&set);
  CPU_SET(first, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0 ? first : -1;
}

}  // namespace dp::test
