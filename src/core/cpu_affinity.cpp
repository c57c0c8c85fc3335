#include "core/cpu_affinity.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace dp {

int machine_cpus() {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

int usable_cpus() {
  // A mask sized for the machine rather than the fixed cpu_set_t, which stops at 1024 CPUs.
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  const int slots = static_cast<int>(std::max(configured, 1024L));
  cpu_set_t* set = CPU_ALLOC(slots);
  if (set == nullptr) return machine_cpus();
  const size_t bytes = CPU_ALLOC_SIZE(slots);
  CPU_ZERO_S(bytes, set);
  const int count = sched_getaffinity(0, bytes, set) == 0 ? CPU_COUNT_S(bytes, set) : 0;
  CPU_FREE(set);
  return count > 0 ? count : machine_cpus();
}

}  // namespace dp
