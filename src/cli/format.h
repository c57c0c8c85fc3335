#pragma once
// Human-readable numbers for CLI output.
#include <cstdint>
#include <string>

namespace dp::cli {

std::string human_bytes(uint64_t bytes);   // "23.80 GB" (decimal, as the model cards state sizes)
std::string human_count(uint64_t count);   // "11.90 B", "339.8 M"

}  // namespace dp::cli
