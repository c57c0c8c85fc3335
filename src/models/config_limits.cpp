#include "models/config_limits.h"

#include "core/error.h"

namespace dp::models {

void check_config_range(const std::string& source, const char* field, int64_t value, int64_t low, int64_t high) {
  DP_CHECK(value >= low && value <= high, source, ": ", field, " must be in [", low, ", ", high, "], got ", value);
}

void check_config_size(const std::string& source, const char* field, int64_t value) {
  check_config_range(source, field, value, 1, kMaxConfigSize);
}

}  // namespace dp::models
