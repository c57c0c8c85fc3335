// The one output writer (core/atomic_file): what readers see, what is left behind on failures and signals,
// and that non-regular targets (devices, FIFOs, symlinks) are refused before any work, /dev/null discarding.
// tests/unit/core_output_policy_test.cpp has the policy's own cases (links, collisions, a full file system).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "test_support.h"

namespace dp {
namespace {

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  return names;
}

// Temporaries this writer made in `dir` and left there (".NAME.XXXXXX.partial").
std::vector<std::string> partial_files_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& name : entries_of(dir))
    if (name.size() > 8 && name.compare(name.size() - 8, 8, ".partial") == 0) found.push_back(name);
  return found;
}

// Points TMPDIR at a fresh folder for the test's lifetime, so that what the writer leaves in the system temp
// folder can be checked without seeing other processes' files.
class PrivateTmpdir {
 public:
  PrivateTmpdir() : dir_(dp::test::temp_dir("atomic-tmpdir")) {
    const char* old = std::getenv("TMPDIR");
    if (old != nullptr) old_ = old, had_old_ = true;
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  ~PrivateTmpdir() {
    if (had_old_) ::setenv("TMPDIR", old_.c_str(), 1);
    else ::unsetenv("TMPDIR");
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, old_;
  bool had_old_ = false;
};

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

std::string thrown_by(const std::function<void()>& work) {
  try {
    work();
  } catch (const Error& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

void write_temp(const AtomicFile& file, const std::string& bytes) {
  std::ofstream out(file.temp_path(), std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(AtomicFile, WritesTheTargetAndLeavesNoTemporary) {
  const auto dir = dp::test::temp_dir("atomic");
  write_file_atomically(dir + "/a.txt", "hello");
  EXPECT_EQ(dp::test::read_file(dir + "/a.txt"), "hello");
  write_file_atomically(dir + "/a.txt", "replaced");
  EXPECT_EQ(dp::test::read_file(dir + "/a.txt"), "replaced");
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"a.txt"});
}

TEST(AtomicFile, NewFilesGetTheUmaskModeAndReplacedFilesKeepTheirs) {
  const auto dir = dp::test::temp_dir("atomic-mode");
  const mode_t mask = ::umask(022);
  ::umask(mask);
  write_file_atomically(dir + "/new.txt", "x");
  // mkstemp creates 0600 files: an output must not become unreadable to the group because of how it was written.
  EXPECT_EQ(mode_of(dir + "/new.txt") & 07777, 0666 & ~mask);
  dp::test::write_file(dir + "/kept.txt", "old");
  ASSERT_EQ(::chmod((dir + "/kept.txt").c_str(), 0640), 0);
  write_file_atomically(dir + "/kept.txt", "new");
  EXPECT_EQ(mode_of(dir + "/kept.txt") & 07777, 0640u);
}

TEST(AtomicFile, TemporariesAreUniqueAndHiddenBesideTheTarget) {
  const auto dir = dp::test::temp_dir("atomic-unique");
  AtomicFile first(dir + "/out.png");
  AtomicFile second(dir + "/out.png");
  EXPECT_NE(first.temp_path(), second.temp_path());
  for (const auto* file : {&first, &second}) {
    const std::string name = file->temp_path().substr(file->temp_path().rfind('/') + 1);
    EXPECT_EQ(name.rfind(".out.png.", 0), 0u) << name;
    EXPECT_EQ(file->temp_path().substr(0, dir.size()), dir);
  }
  write_temp(first, "first");
  write_temp(second, "second");
  first.commit();
  second.commit();
  EXPECT_EQ(dp::test::read_file(dir + "/out.png"), "second");
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"out.png"});
}

TEST(AtomicFile, AnUncommittedWriterLeavesNothingAndKeepsTheOldContent) {
  const auto dir = dp::test::temp_dir("atomic-abort");
  dp::test::write_file(dir + "/kept.png", "old");
  try {
    AtomicFile file(dir + "/kept.png");
    write_temp(file, "half a PNG");
    throw std::runtime_error("the encoder failed");
  } catch (const std::runtime_error&) {
  }
  {
    AtomicFile file(dir + "/never.png");
    write_temp(file, "abandoned");
  }
  EXPECT_EQ(dp::test::read_file(dir + "/kept.png"), "old");
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"kept.png"});
}

TEST(AtomicFile, BadTargetsFailBeforeAnyWorkAndCreateNothing) {
  const auto dir = dp::test::temp_dir("atomic-bad");
  ::mkdir((dir + "/folder").c_str(), 0755);
  EXPECT_NE(thrown_by([&] { check_output_path(dir + "/folder"); }).find("is a directory"), std::string::npos);
  EXPECT_NE(thrown_by([&] { AtomicFile f(dir + "/folder"); }).find("is a directory"), std::string::npos);
  EXPECT_NE(thrown_by([&] { check_output_path(dir + "/missing/x.png"); }).find("does not exist"), std::string::npos);
  EXPECT_NE(thrown_by([&] { check_output_path(""); }).find("empty"), std::string::npos);
  // procfs accepts no new files, not even from root: the check tries for real rather than trusting permissions.
  EXPECT_NE(thrown_by([&] { check_output_path("/proc/diffpipe-out.png"); }).find("cannot create"), std::string::npos);
  EXPECT_TRUE(entries_of(dir + "/folder").empty());
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"folder"});
}

TEST(AtomicFile, DevNullDiscardsAndStaysADevice) {
  const PrivateTmpdir tmp;
  const auto before = partial_files_in("/dev");
  write_file_atomically("/dev/null", "discarded");
  check_output_path("/dev/null");
  EXPECT_TRUE(S_ISCHR(mode_of("/dev/null")));
  EXPECT_EQ(partial_files_in("/dev"), before);
  EXPECT_TRUE(entries_of(tmp.dir()).empty());
}

TEST(AtomicFile, OtherDevicesAreRefusedBeforeAnyWork) {
  const PrivateTmpdir tmp;
  const std::string message = thrown_by([] { write_file_atomically("/dev/full", "no room"); });
  EXPECT_NE(message.find("/dev/full: is a character device; diffpipe writes only regular files"), std::string::npos)
      << message;
  EXPECT_TRUE(S_ISCHR(mode_of("/dev/full")));
  EXPECT_TRUE(partial_files_in("/dev").empty());
  EXPECT_TRUE(entries_of(tmp.dir()).empty());
}

// Runs `work` in a child process and returns its exit status. `unprivileged`: as user nobody when the tests
// run as root, for whom /dev is not writable (a root test run would never notice that).
int exit_status_in_child(const std::function<int()>& work, bool unprivileged = false) {
  const pid_t child = ::fork();
  if (child == 0) {
    if (unprivileged && ::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(90);
    int code = 91;
    try {
      code = work();
    } catch (...) {
      code = 92;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(AtomicFile, DevNullNeedsNoWritableDev) {
  const int status = exit_status_in_child(
      [] {
        write_file_atomically("/dev/null", "discarded");
        return 0;
      },
      /*unprivileged=*/true);
  EXPECT_EQ(status, 0);
}

TEST(AtomicFile, AFifoIsRefusedWithoutWaitingForAReader) {
  const auto dir = dp::test::temp_dir("atomic-fifo");
  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No reader: a write would block for ever (the run's work done, its output never delivered).
  EXPECT_NE(thrown_by([&] { write_file_atomically(fifo, "never"); }).find("is a FIFO"), std::string::npos);
  EXPECT_TRUE(S_ISFIFO(mode_of(fifo)));
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"pipe"});
}

TEST(AtomicFile, ASymlinkIsRefusedAndWhatItPointsAtKept) {
  const auto dir = dp::test::temp_dir("atomic-link");
  ::mkdir((dir + "/results").c_str(), 0755);
  dp::test::write_file(dir + "/results/real.png", "old");
  ASSERT_EQ(::symlink("results/real.png", (dir + "/link.png").c_str()), 0);
  EXPECT_NE(thrown_by([&] { write_file_atomically(dir + "/link.png", "new"); }).find("is a symbolic link"),
            std::string::npos);
  EXPECT_TRUE(S_ISLNK(mode_of(dir + "/link.png")));
  EXPECT_EQ(dp::test::read_file(dir + "/results/real.png"), "old");
  EXPECT_TRUE(partial_files_in(dir).empty());
  EXPECT_TRUE(partial_files_in(dir + "/results").empty());
}

// A child process creates a temporary, tells the parent, and waits to be killed by `signal_number`.
void expect_signal_removes_temporary(int signal_number) {
  const auto dir = dp::test::temp_dir("atomic-signal");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    install_partial_file_cleanup();
    AtomicFile file(dir + "/out.h5");
    write_temp(file, std::string(1 << 20, 'x'));
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_EQ(partial_files_in(dir).size(), 1u);
  ::kill(child, signal_number);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signal_number) << "status " << status;
  EXPECT_TRUE(entries_of(dir).empty()) << ::testing::PrintToString(entries_of(dir));
}

TEST(AtomicFile, SignalsRemoveTheTemporaryAndStillEndTheProcess) {
  for (int signal_number : {SIGTERM, SIGINT, SIGHUP}) {
    SCOPED_TRACE(strsignal(signal_number));
    expect_signal_removes_temporary(signal_number);
  }
}

TEST(AtomicFile, AnIgnoredSignalStaysIgnoredAndTheWriteCompletes) {
  // nohup runs a command with SIGHUP ignored: the hang-up must neither kill it nor delete its temporary.
  const auto dir = dp::test::temp_dir("atomic-nohup");
  const int status = exit_status_in_child([&] {
    ::signal(SIGHUP, SIG_IGN);
    install_partial_file_cleanup();
    AtomicFile file(dir + "/out.png");
    write_temp(file, "survives the hang-up");
    ::raise(SIGHUP);
    file.commit();
    return dp::test::read_file(dir + "/out.png") == "survives the hang-up" ? 0 : 1;
  });
  EXPECT_EQ(status, 0);
}

}  // namespace
}  // namespace dp
