// The log (core/log.h) when stderr stops taking lines: a process whose stderr is a full pipe that nobody reads
// keeps working, drops and counts its lines, and says how many it lost once the pipe is read again.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "core/log.h"

namespace dp {
namespace {

// Reads what is in `fd` now, waiting at most `milliseconds` for the first byte.
std::string drain(int fd, int milliseconds) {
  std::string text;
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, text.empty() ? milliseconds : 200) == 1) {
    char buffer[65536];
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got <= 0) break;
    text.append(buffer, static_cast<size_t>(got));
  }
  return text;
}

TEST(Log, AStalledStderrNeverHoldsTheProcessAndTheLossIsCounted) {
  int err[2], done[2], go[2];
  ASSERT_EQ(::pipe(err), 0);
  ASSERT_EQ(::pipe(done), 0);
  ASSERT_EQ(::pipe(go), 0);
  // A pipe as mpirun gives each rank (64 kB on Linux): 3000 lines of ~130 bytes are six times that.
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(err[0]);
    ::close(done[0]);
    ::close(go[1]);
    ::dup2(err[1], STDERR_FILENO);
    const auto started = std::chrono::steady_clock::now();
    for (int i = 0; i < 3000; ++i) DP_INFO("line ", i, " of a run whose log nobody reads ", std::string(60, '.'));
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    const std::string report = std::to_string(ms.count());
    (void)!::write(done[1], report.data(), report.size());
    char byte;
    (void)!::read(go[0], &byte, 1);  // the reader is back
    DP_INFO("the last line");
    ::_exit(0);
  }
  ::close(err[1]);
  ::close(done[1]);
  ::close(go[0]);
  // The child must finish its 3000 lines while nobody reads its stderr: a blocking log would hold it for ever.
  const std::string took = drain(done[0], 20000);
  if (took.empty()) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    FAIL() << "the child blocked writing its log to a full pipe (nothing for 20 s)";
  }
  EXPECT_LT(std::stoi(took), 5000) << "ms for 3000 lines with stderr stalled";
  std::string log = drain(err[0], 1000);
  (void)!::write(go[1], "g", 1);
  log += drain(err[0], 2000);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_NE(log.find("line 0 of a run"), std::string::npos);
  const auto notice = log.find(" log line(s) dropped: stderr took nothing for ");
  ASSERT_NE(notice, std::string::npos) << log.substr(log.size() > 2000 ? log.size() - 2000 : 0);
  const auto count_start = log.rfind("] ", notice) + 2;
  const long dropped = std::stol(log.substr(count_start, notice - count_start));
  EXPECT_GT(dropped, 1000);
  EXPECT_LT(dropped, 3000);
  EXPECT_NE(log.find("the last line", notice), std::string::npos) << log;
  // What got through is whole lines (each a piece of at most PIPE_BUF bytes written whole).
  EXPECT_EQ(log.back(), '\n');
}

}  // namespace
}  // namespace dp
