#pragma once
// The process's memory as the kernel counts it (resident set, and its high-water mark since the last reset).
// The one place diffpipe reads host memory figures, so reports and logs agree on what "peak" means.
#include <cstdint>

namespace dp {

// VmRSS: bytes resident now.
uint64_t resident_bytes();
// VmHWM: the highest resident set since the process started or since reset_peak_resident().
uint64_t peak_resident_bytes();
// Restarts VmHWM from the current resident set (writes "5" to /proc/self/clear_refs), so a stage can
// report its own peak rather than the process's.
void reset_peak_resident();

}  // namespace dp
