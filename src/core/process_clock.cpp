#include "core/process_clock.h"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace dp {
namespace {

double age_at_main = -1;

// Field 22 of /proc/self/stat (starttime, in clock ticks since boot). The command name before it is in
// parentheses and may hold spaces or ')', so the fields are counted from the last ')'.
double start_ticks_since_boot() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  // After ')': state is field 3, so starttime (22) is the 20th word.
  for (int i = 0; i < 20; ++i)
    if (!(fields >> field)) return -1;
  try {
    return std::stod(field);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

double process_age_seconds() {
  const double ticks = start_ticks_since_boot();
  const long per_second = ::sysconf(_SC_CLK_TCK);
  timespec now{};
  if (ticks < 0 || per_second <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  const double since_boot = static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
  return since_boot - ticks / static_cast<double>(per_second);
}

void mark_main_entered() { age_at_main = process_age_seconds(); }

double age_at_main_seconds() { return age_at_main; }

}  // namespace dp
