// The only translation unit that includes spdlog. It is built in a target without LibTorch includes.
#include "core/log.h"

#include <limits.h>
#include <poll.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
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

// stderr that never holds the caller for long. A rank's stderr is a pipe to mpirun (or srun, or a terminal);
// when its reader stops (a SIGSTOPped mpirun, a stalled terminal) a plain write blocks once the pipe is full,
// and the rank with it, past every --transport-timeout. Here each line waits at most kGrace for room; a line
// that finds none is dropped and counted, later lines are dropped at once while the stall lasts, and the first
// line that gets through again is preceded by how many were lost. The file descriptor's flags are left alone:
// O_NONBLOCK would change the shared open file of the shell or mpirun too.
class StderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  StderrSink() : colors_(::isatty(STDERR_FILENO) == 1) {}
  // At exit (after MPI_Finalize, once mpirun reads again) a stall that no later line ended is still reported.
  ~StderrSink() override { report_pending_drops(); }
  void report_pending_drops() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dropped_ > 0) write_dropped_notice(spdlog::log_clock::now(), "diffpipe", kGraceMilliseconds);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    std::string line = colored(msg, formatted);
    // A stall: nothing is waited for until a line goes through again, which the notice precedes.
    if (dropped_ > 0 && !write_dropped_notice(msg.time, msg.logger_name, 0)) {
      ++dropped_;
      return;
    }
    if (!write_all(line, kGraceMilliseconds)) {
      if (dropped_ == 0) stalled_at_ = std::chrono::steady_clock::now();
      ++dropped_;
    }
  }
  void flush_() override {}

 private:
  static constexpr int kGraceMilliseconds = 250;

  std::string colored(const spdlog::details::log_msg& msg, const spdlog::memory_buf_t& formatted) const {
    std::string text(formatted.data(), formatted.size());
    if (!colors_ || msg.color_range_end <= msg.color_range_start || msg.color_range_end > text.size()) return text;
    const char* code = "";
    switch (msg.level) {
      case spdlog::level::trace: code = "\033[37m"; break;
      case spdlog::level::debug: code = "\033[36m"; break;
      case spdlog::level::info: code = "\033[32m"; break;
      case spdlog::level::warn: code = "\033[33m\033[1m"; break;
      case spdlog::level::err:
      case spdlog::level::critical: code = "\033[31m\033[1m"; break;
      default: return text;
    }
    text.insert(msg.color_range_end, "\033[m");
    text.insert(msg.color_range_start, code);
    return text;
  }

  // "N log line(s) dropped ..." as a warning line of the usual pattern; false (nothing written) while stderr
  // still takes nothing.
  bool write_dropped_notice(spdlog::log_clock::time_point time, spdlog::string_view_t logger_name, int wait) {
    if (!writable(wait)) return false;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stalled_at_).count();
    char text[200];
    std::snprintf(text, sizeof text,
                  "%llu log line(s) dropped: stderr took nothing for %.1f s (a stopped or stalled reader); the run "
                  "went on",
                  static_cast<unsigned long long>(dropped_), seconds);
    spdlog::details::log_msg notice(time, spdlog::source_loc{}, logger_name, spdlog::level::warn, text);
    spdlog::memory_buf_t notice_text;
    formatter_->format(notice, notice_text);
    const std::string prefix = cut_line_ ? "\n" : "";
    dropped_ = 0;
    cut_line_ = false;
    write_all(prefix + std::string(notice_text.data(), notice_text.size()), 0);
    return true;
  }

  static bool writable(int wait_milliseconds) {
    pollfd fd{STDERR_FILENO, POLLOUT, 0};
    for (;;) {
      const int ready = ::poll(&fd, 1, wait_milliseconds);
      if (ready < 0 && errno == EINTR) continue;
      return ready == 1 && (fd.revents & POLLOUT) != 0 && (fd.revents & (POLLERR | POLLNVAL)) == 0;
    }
  }

  // Writes `text` in pieces of at most PIPE_BUF bytes, each after poll says there is room: a pipe takes such a
  // piece whole without blocking. False when stderr stayed full (the rest of `text` is lost) or failed.
  bool write_all(const std::string& text, int wait_milliseconds) {
    size_t done = 0;
    while (done < text.size()) {
      if (!writable(done == 0 ? wait_milliseconds : kGraceMilliseconds)) {
        cut_line_ = done > 0;
        return false;
      }
      const size_t piece = std::min<size_t>(text.size() - done, PIPE_BUF);
      const ssize_t wrote = ::write(STDERR_FILENO, text.data() + done, piece);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        cut_line_ = done > 0;
        return false;
      }
      done += static_cast<size_t>(wrote);
    }
    return true;
  }

  const bool colors_;
  unsigned long long dropped_ = 0;
  bool cut_line_ = false;  // a dropped line had been partly written
  std::chrono::steady_clock::time_point stalled_at_;
};

std::shared_ptr<StderrSink>& stderr_sink() {
  static std::shared_ptr<StderrSink> sink = std::make_shared<StderrSink>();
  return sink;
}

spdlog::logger& logger() {
  // stderr, so that stdout stays clean for --json output.
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto made = std::make_shared<spdlog::logger>("diffpipe", stderr_sink());
    made->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    made->set_level(spdlog::level::trace);
    return made;
  }();
  return *instance;
}

}  // namespace

void finish() { stderr_sink()->report_pending_drops(); }

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

// "rank N: " as messages written before the prefix existed start; dropped from them once the prefix says it.
std::string& own_rank_words() {
  static std::string words;
  return words;
}

void set_rank(int rank) {
  logger().set_pattern("[%H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%^%l%$] %v");
  own_rank_words() = "rank " + std::to_string(rank) + ": ";
}

void write(Level level, const std::string& message) {
  // The line's prefix names the rank: "[rank 1] [info] rank 1: loaded ..." says it once.
  const std::string& own = own_rank_words();
  if (!own.empty() && message.compare(0, own.size(), own) == 0) {
    logger().log(to_spdlog(level), message.substr(own.size()));
    return;
  }
  logger().log(to_spdlog(level), message);
}

}  // namespace dp::log
