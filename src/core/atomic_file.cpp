#include "core/atomic_file.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>

#include "core/error.h"
#include "core/output_policy.h"

namespace dp {
namespace {

// Live temporaries, in fixed storage a signal handler can walk without allocating or locking. A slot is
// claimed under the mutex; the handler only reads the flag and the path and calls unlink (async-signal-safe).
constexpr int kSlots = 64;
struct Slot {
  std::atomic<bool> used{false};
  char path[4096] = {};
};
std::array<Slot, kSlots> g_slots;
std::mutex g_slots_mutex;

void claim_slot(const std::string& path) {
  if (path.size() >= sizeof(Slot::path)) return;
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (auto& slot : g_slots) {
    if (slot.used.load()) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.used.store(true);
    return;
  }
  // More than kSlots live temporaries: still removed on exceptions, not on signals.
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
constexpr int kCleanupSignalCount = 3;
struct sigaction g_previous[kCleanupSignalCount];
std::atomic<bool> g_installed{false};

void remove_partial_files_and_reraise(int signal_number) {
  const int saved_errno = errno;
  for (auto& slot : g_slots) {
    if (slot.used.load()) ::unlink(slot.path);
  }
  for (int i = 0; i < kCleanupSignalCount; ++i) {
    if (kCleanupSignals[i] == signal_number) ::sigaction(signal_number, &g_previous[i], nullptr);
  }
  // Delivered when this handler returns (the signal is blocked while it runs), with the old disposition.
  ::raise(signal_number);
  errno = saved_errno;
}

// Blocks the cleanup signals in this thread while a temporary is created and registered, so that no signal
// can land between the two and leave an unregistered file behind.
class CleanupSignalsBlocked {
 public:
  CleanupSignalsBlocked() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : kCleanupSignals) sigaddset(&set, s);
    ::pthread_sigmask(SIG_BLOCK, &set, &previous_);
  }
  ~CleanupSignalsBlocked() { ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  CleanupSignalsBlocked(const CleanupSignalsBlocked&) = delete;
  CleanupSignalsBlocked& operator=(const CleanupSignalsBlocked&) = delete;

 private:
  sigset_t previous_;
};

std::string errno_text() { return std::strerror(errno); }

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string file_name_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Where temporaries for non-regular targets go: their own folder (/dev) is usually not writable.
std::string system_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

// The mode a new output gets, as open(O_CREAT, 0666) would under the process's umask; read from
// /proc/self/status because umask() can only be read by setting it, which races with other threads.
mode_t new_file_mode() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) != 0) continue;
    try {
      return static_cast<mode_t>(0666 & ~std::stoul(line.substr(6), nullptr, 8));
    } catch (const std::exception&) {
      break;
    }
  }
  return 0644;
}

// Creates a unique empty file ".NAME.XXXXXX.partial" in `dir` with `mode`, registered for removal on
// signals when `register_for_signals`; returns its path.
std::string make_temporary(const std::string& dir, const std::string& target, mode_t mode,
                           bool register_for_signals) {
  std::string pattern = (dir == "/" ? "" : dir) + "/." + file_name_of(target) + ".XXXXXX.partial";
  const CleanupSignalsBlocked blocked;
  const int fd = ::mkstemps(pattern.data(), 8);
  DP_CHECK(fd >= 0, target, ": cannot create a file in ", dir, " (", errno_text(), ")");
  // mkstemp makes the file 0600; the output should get the mode any other new (or the replaced) file would.
  const int rc = ::fchmod(fd, mode);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) {
    ::unlink(pattern.c_str());
    errno = saved;
    DP_FAIL(target, ": cannot set the mode of ", pattern, " (", errno_text(), ")");
  }
  if (register_for_signals) claim_slot(pattern);
  return pattern;
}

void sync_path(const std::string& path, bool directory, const std::string& target) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  DP_CHECK(fd >= 0, target, ": cannot open ", path, " to sync it (", errno_text(), ")");
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  DP_CHECK(rc == 0, target, ": fsync of ", path, " failed (", errno_text(), ")",
           space_failure_text(saved, directory ? path : directory_of(path)));
}

}  // namespace

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)) {
  check_output_path(target_);
  struct stat st {};
  const bool exists = ::lstat(target_.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    // /dev/null (check_output_path refused every other non-regular target): produced, then discarded.
    discard_ = true;
    temp_ = make_temporary(system_temp_dir(), target_, 0600, true);
  } else {
    // Replacing a file keeps its permissions; a new one gets the umask's.
    const mode_t mode = exists ? (st.st_mode & 07777) : new_file_mode();
    temp_ = make_temporary(directory_of(target_), target_, mode, true);
  }
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  ::unlink(temp_.c_str());
  release_slot(temp_);
}

void AtomicFile::write(const std::function<void(const std::string& temp)>& fill) {
  errno = 0;
  try {
    fill(temp_);
  } catch (const Error& e) {
    const int saved = errno;
    const std::string detail = space_failure_text(saved, directory_of(temp_));
    if (detail.empty()) throw;
    // The cause goes before the " [file:line]" that every message ends with.
    std::string text = e.what();
    const auto location = text.rfind(" [");
    text.insert(location == std::string::npos ? text.size() : location, detail);
    throw Error(text, e.file(), e.line());
  }
}

void AtomicFile::commit() {
  DP_CHECK(!committed_, target_, ": committed twice");
  try {
    if (discard_) {
      ::unlink(temp_.c_str());
    } else {
      sync_path(temp_, false, target_);
      // rename() replaces the name: a link put there since the check is replaced, never followed.
      DP_CHECK(::rename(temp_.c_str(), target_.c_str()) == 0, target_, ": cannot rename ", temp_, " over it (",
               errno_text(), ")");
      sync_path(directory_of(target_), true, target_);
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
  file.write([&](const std::string& temp) {
    const int fd = ::open(temp.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW);
    DP_CHECK(fd >= 0, path, ": cannot open ", temp, " (", errno_text(), ")");
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t wrote = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        const int saved = errno;
        ::close(fd);
        errno = saved;
        DP_FAIL(path, ": write failed (", std::strerror(saved), ")");
      }
      done += static_cast<size_t>(wrote);
    }
    const int rc = ::close(fd);
    DP_CHECK(rc == 0, path, ": close failed (", errno_text(), ")");
  });
  file.commit();
}

void install_partial_file_cleanup() {
  if (g_installed.exchange(true)) return;
  for (int i = 0; i < kCleanupSignalCount; ++i) {
    // A signal the process was started ignoring (nohup's SIGHUP, a background job's SIGINT) stays ignored:
    // catching it would delete the temporaries of a run that then carries on and fails at commit.
    ::sigaction(kCleanupSignals[i], nullptr, &g_previous[i]);
    if (g_previous[i].sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = remove_partial_files_and_reraise;
    sigemptyset(&action.sa_mask);
    ::sigaction(kCleanupSignals[i], &action, nullptr);
  }
}

}  // namespace dp
