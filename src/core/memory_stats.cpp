#include "core/memory_stats.h"

#include <fstream>
#include <string>

namespace dp {
namespace {

// A "Vm...:   1234 kB" line of /proc/self/status, in bytes; 0 when the kernel does not report it.
uint64_t status_kilobytes(const char* field) {
  std::ifstream status("/proc/self/status");
  const std::string prefix = std::string(field) + ":";
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    try {
      return std::stoull(line.substr(prefix.size())) * 1024;
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 0;
}

}  // namespace

uint64_t resident_bytes() { return status_kilobytes("VmRSS"); }

uint64_t peak_resident_bytes() { return status_kilobytes("VmHWM"); }

void reset_peak_resident() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
}

}  // namespace dp
