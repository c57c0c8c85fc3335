#pragma once
// Logging facade. spdlog lives behind this header only: LibTorch ships its own fmt, which breaks
// spdlog's headers in any translation unit that sees both (see shared GPU.md).
// Lines go to stderr and never hold the caller for long: when stderr stops taking them (a stopped mpirun, a
// stalled terminal) a line waits at most 250 ms, then lines are dropped and counted until stderr takes one
// again, which is preceded by a warning saying how many were lost. A rank's compute is never held by its log.
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
// Reports a stall that no later line ended, as the sink does when it is destroyed at exit: for a process that
// ends without running destructors (runtime::World::end_process).
void finish();
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
