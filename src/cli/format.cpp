#include "cli/format.h"

#include <cstdio>

namespace dp::cli {

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1000.0 && unit < 4) {
    value /= 1000.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

std::string human_count(uint64_t count) {
  const char* units[] = {"", " k", " M", " B", " T"};
  double value = static_cast<double>(count);
  int unit = 0;
  while (value >= 1000.0 && unit < 4) {
    value /= 1000.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f%s" : "%.2f%s", value, units[unit]);
  return text;
}

}  // namespace dp::cli
