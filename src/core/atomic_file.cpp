#include "core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"

namespace dp {
namespace {

namespace fs = std::filesystem;

// Live temporaries, in fixed storage a signal handler can walk without allocating or locking. A slot is
// claimed under the mutex; the handler only reads the flag and the path and calls unlink (async-signal-safe).
constexpr int kSlots = 64;
struct Slot {
  std::atomic<bool> used{false};
  char path[4096] = {};
};
std::array<Slot, kSlots> g_slots;
std::mutex g_slots_mutex;

int claim_slot(const std::string& path) {
  if (path.size() >= sizeof(Slot::path)) return -1;
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (g_slots[i].used.load()) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].used.store(true);
    return i;
  }
  return -1;  // more than kSlots live temporaries: still removed on exceptions, not on signals
}

void release_slot(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (auto& slot : g_slots) {
    if (slot.used.load() && path == slot.path) {
      slot.used.store(false);
      return;
    }
  }
}

constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_previous[3];
std::atomic<bool> g_installed{false};

void remove_partial_files_and_reraise(int signal_number) {
  for (auto& slot : g_slots) {
    if (slot.used.load()) ::unlink(slot.path);
  }
  for (int i = 0; i < 3; ++i) {
    if (kCleanupSignals[i] == signal_number) ::sigaction(signal_number, &g_previous[i], nullptr);
  }
  ::raise(signal_number);
}

std::string errno_text() { return std::strerror(errno); }

fs::path directory_of(const std::string& path) {
  fs::path dir = fs::path(path).parent_path();
  return dir.empty() ? fs::path(".") : dir;
}

// The mode a plain open(O_CREAT, 0666) would give: mkstemp creates 0600, which would hide outputs from the
// group and others against the user's umask. Read from /proc (umask() itself changes process state).
mode_t default_file_mode() {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  unsigned mask = 022;
  if (status != nullptr) {
    char line[256];
    while (std::fgets(line, sizeof line, status) != nullptr) {
      if (std::sscanf(line, "Umask: %o", &mask) == 1) break;
    }
    std::fclose(status);
  }
  return static_cast<mode_t>(0666 & ~mask);
}

// Creates a unique empty file ".NAME.XXXXXX.partial" beside `target`; returns its path.
std::string make_temporary(const std::string& target) {
  const fs::path dir = directory_of(target);
  std::string pattern = (dir / ("." + fs::path(target).filename().string() + ".XXXXXX.partial")).string();
  const int fd = ::mkstemps(pattern.data(), 8);
  DP_CHECK(fd >= 0, target, ": cannot create a file in ", dir.string(), " (", errno_text(), ")");
  ::fchmod(fd, default_file_mode());
  ::close(fd);
  return pattern;
}

void sync_path(const std::string& path, bool directory, const std::string& target) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  DP_CHECK(fd >= 0, target, ": cannot open ", path, " to sync it (", errno_text(), ")");
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  DP_CHECK(rc == 0, target, ": fsync of ", path, " failed (", errno_text(), ")");
}

// Copies the temporary's bytes into a non-regular target opened for writing (no truncation, no rename).
void copy_into(const std::string& temp, const std::string& target) {
  const int in = ::open(temp.c_str(), O_RDONLY);
  DP_CHECK(in >= 0, target, ": cannot reopen ", temp, " (", errno_text(), ")");
  const int out = ::open(target.c_str(), O_WRONLY);
  if (out < 0) {
    const std::string why = errno_text();
    ::close(in);
    DP_FAIL(target, ": cannot open for writing (", why, ")");
  }
  char buffer[1 << 16];
  std::string failure;
  for (;;) {
    const ssize_t got = ::read(in, buffer, sizeof buffer);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      failure = "read of " + temp + " failed (" + errno_text() + ")";
      break;
    }
    for (ssize_t done = 0; done < got && failure.empty();) {
      const ssize_t wrote = ::write(out, buffer + done, static_cast<size_t>(got - done));
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) failure = "write failed (" + errno_text() + ")";
      else done += wrote;
    }
    if (!failure.empty()) break;
  }
  ::close(in);
  ::close(out);
  DP_CHECK(failure.empty(), target, ": ", failure);
}

}  // namespace

void check_output_path(const std::string& path) {
  DP_CHECK(!path.empty(), "the output path is empty");
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) DP_FAIL(path, ": is a directory; name a file to write");
  const fs::path dir = directory_of(path);
  DP_CHECK(fs::is_directory(dir), path, ": directory ", dir.string(), " does not exist");
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    // Written in place at commit: it must open for writing now.
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    DP_CHECK(fd >= 0 || errno == ENXIO, path, ": cannot open for writing (", errno_text(), ")");
    if (fd >= 0) ::close(fd);
    return;
  }
  // A real attempt: permissions alone say yes to root on a read-only file system.
  const std::string probe = make_temporary(path);
  ::unlink(probe.c_str());
}

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)) {
  check_output_path(target_);
  temp_ = make_temporary(target_);
  claim_slot(temp_);
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  ::unlink(temp_.c_str());
  release_slot(temp_);
}

void AtomicFile::commit() {
  DP_CHECK(!committed_, target_, ": committed twice");
  try {
    std::error_code ec;
    const fs::file_status status = fs::status(target_, ec);
    if (fs::exists(status) && !fs::is_regular_file(status)) {
      DP_CHECK(!fs::is_directory(status), target_, ": is a directory; name a file to write");
      copy_into(temp_, target_);
      ::unlink(temp_.c_str());
    } else {
      sync_path(temp_, false, target_);
      DP_CHECK(::rename(temp_.c_str(), target_.c_str()) == 0, target_, ": cannot rename ", temp_, " over it (",
               errno_text(), ")");
      sync_path(directory_of(target_).string(), true, target_);
    }
  } catch (...) {
    ::unlink(temp_.c_str());
    release_slot(temp_);
    committed_ = true;  // nothing left to clean
    throw;
  }
  release_slot(temp_);
  committed_ = true;
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  AtomicFile file(path);
  {
    const int fd = ::open(file.temp_path().c_str(), O_WRONLY | O_TRUNC);
    DP_CHECK(fd >= 0, path, ": cannot open ", file.temp_path(), " (", errno_text(), ")");
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t wrote = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        const std::string why = errno_text();
        ::close(fd);
        DP_FAIL(path, ": write failed (", why, ")");
      }
      done += static_cast<size_t>(wrote);
    }
    DP_CHECK(::close(fd) == 0, path, ": close failed (", errno_text(), ")");
  }
  file.commit();
}

void install_partial_file_cleanup() {
  if (g_installed.exchange(true)) return;
  for (int i = 0; i < 3; ++i) {
    struct sigaction action {};
    action.sa_handler = remove_partial_files_and_reraise;
    sigemptyset(&action.sa_mask);
    ::sigaction(kCleanupSignals[i], &action, &g_previous[i]);
  }
}

}  // namespace dp
