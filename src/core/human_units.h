#pragma once
// Figures for people, in logs: a duration in the unit that suits it ("1.3 ms", "2.41 s", "3 min 12 s") and a
// byte count in decimal units ("4.85 GB", as model cards state sizes). Three significant digits: a log line is
// read, not parsed (--report and --report-json keep the exact numbers).
#include <cstdint>
#include <string>

namespace dp {

std::string human_seconds(double seconds);
std::string human_size(double bytes);

}  // namespace dp
