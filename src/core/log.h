#pragma once
// Logging facade. spdlog lives behind this header only: LibTorch ships its own fmt, which breaks
// spdlog's headers in any translation unit that sees both (see shared GPU.md).
#include <string>

#include "core/error.h"

namespace dp::log {

enum class Level { trace, debug, info, warn, error, off };

void set_level(Level level);
Level level();
Level parse_level(const std::string& name);  // throws dp::Error naming the bad value
// Adds "[rank N]" to every line; called once the MPI world is known.
void set_rank(int rank);
void write(Level level, const std::string& message);
bool enabled(Level level);

}  // namespace dp::log

#define DP_LOG_AT(lvl, ...)                                                            \
  do {                                                                                 \
    if (::dp::log::enabled(lvl)) ::dp::log::write(lvl, ::dp::str(__VA_ARGS__));       \
  } while (0)
#define DP_DEBUG(...) DP_LOG_AT(::dp::log::Level::debug, __VA_ARGS__)
#define DP_INFO(...) DP_LOG_AT(::dp::log::Level::info, __VA_ARGS__)
#define DP_WARN(...) DP_LOG_AT(::dp::log::Level::warn, __VA_ARGS__)
#define DP_ERROR(...) DP_LOG_AT(::dp::log::Level::error, __VA_ARGS__)
