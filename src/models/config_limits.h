#pragma once
// Bounds the config parsers put on the values that size a model, checked when config.json is read. They are
// far beyond any released model, and low enough that products of two sizes fit in int64 and that the
// parameter list of that many layers fits in memory: a typo such as "num_layers": 1900000000 is refused with
// the file and field named instead of exhausting memory later.
#include <cstdint>
#include <string>

namespace dp::models {

constexpr int64_t kMaxConfigSize = int64_t{1} << 24;  // widths, head counts, vocabularies, channels
constexpr int64_t kMaxConfigLayers = 4096;            // layer and block counts

// Throws "SOURCE: FIELD must be in [LOW, HIGH], got VALUE".
void check_config_range(const std::string& source, const char* field, int64_t value, int64_t low, int64_t high);
// check_config_range for a size: 1 to kMaxConfigSize.
void check_config_size(const std::string& source, const char* field, int64_t value);

}  // namespace dp::models
