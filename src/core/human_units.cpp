#include "core/human_units.h"

#include <cmath>
#include <cstdio>

namespace dp {
namespace {

// `value` with three significant digits (at least none after the point): 1.29 -> "1.29", 12.9 -> "12.9".
std::string three_digits(double value) {
  const int decimals = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  char text[48];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

}  // namespace

std::string human_seconds(double seconds) {
  if (!std::isfinite(seconds)) return std::to_string(seconds) + " s";
  if (seconds < 0) return "-" + human_seconds(-seconds);
  if (seconds == 0) return "0 s";
  if (seconds < 1e-3) return three_digits(seconds * 1e6) + " us";
  if (seconds < 1) return three_digits(seconds * 1e3) + " ms";
  if (seconds < 120) return three_digits(seconds) + " s";
  const auto whole = static_cast<long long>(std::llround(seconds));
  if (whole < 7200) return std::to_string(whole / 60) + " min " + std::to_string(whole % 60) + " s";
  return std::to_string(whole / 3600) + " h " + std::to_string(whole % 3600 / 60) + " min";
}

std::string human_size(double bytes) {
  if (!std::isfinite(bytes) || bytes < 0) return std::to_string(bytes) + " B";
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 5) {
    bytes /= 1000;
    ++unit;
  }
  return unit == 0 ? std::to_string(static_cast<long long>(bytes)) + " B" : three_digits(bytes) + " " + units[unit];
}

}  // namespace dp
