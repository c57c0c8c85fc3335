// The only translation unit that includes spdlog. It is built in a target without LibTorch includes.
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>

namespace dp::log {
namespace {

std::atomic<Level> current_level{Level::info};

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

spdlog::logger& logger() {
  // stderr, so that stdout stays clean for --json output.
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto made = std::make_shared<spdlog::logger>("diffpipe", sink);
    made->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    made->set_level(spdlog::level::trace);
    return made;
  }();
  return *instance;
}

}  // namespace

void set_level(Level level) { current_level = level; }
Level level() { return current_level; }
bool enabled(Level level) { return level >= current_level.load() && level != Level::off; }

Level parse_level(const std::string& name) {
  if (name == "trace") return Level::trace;
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn" || name == "warning") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "off") return Level::off;
  DP_FAIL("unknown log level '", name, "' (expected trace, debug, info, warn, error or off)");
}

void set_rank(int rank) {
  logger().set_pattern("[%H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%^%l%$] %v");
}

void write(Level level, const std::string& message) { logger().log(to_spdlog(level), message); }

}  // namespace dp::log
