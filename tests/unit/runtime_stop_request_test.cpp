// Stop signals (runtime/stop_request.h) in real processes: each case forks a child that installs the handlers
// and is sent real signals by its parent, so a signal that kills is seen as the child's death, not mocked.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "runtime/stop_request.h"

namespace dp::runtime {
namespace {

using namespace std::chrono_literals;

// How the child ended: its exit status, or 128 + the signal that killed it.
struct Ending {
  int status = -1;
  std::string describe() const {
    return status > 128 ? "killed by signal " + std::to_string(status - 128) : "exit " + std::to_string(status);
  }
};

// A child that installs the handlers, tells the parent through a pipe, then waits (bounded, 10 s) and exits
// with the signal it recorded as a stop request (0: none). The parent sends `first`, then `second` after
// `gap`, and collects how the child ended.
Ending signal_twice(int first, int second, std::chrono::milliseconds gap) {
  int ready[2];
  if (::pipe(ready) != 0) ADD_FAILURE() << "pipe failed";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    install_stop_signal_handlers();
    const char byte = 1;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(100);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (stop_signal() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    // Live past the second signal (one that kills does so on arrival), then report the recorded request.
    const auto linger = std::chrono::steady_clock::now() + gap + 1s;
    while (std::chrono::steady_clock::now() < linger) std::this_thread::sleep_for(5ms);
    ::_exit(stop_signal());
  }
  ::close(ready[1]);
  char byte = 0;
  const bool started = ::read(ready[0], &byte, 1) == 1;
  ::close(ready[0]);
  EXPECT_TRUE(started) << "the child did not install its handlers";
  ::kill(child, first);
  std::this_thread::sleep_for(gap);
  ::kill(child, second);
  int status = 0;
  ::waitpid(child, &status, 0);
  return {WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status)};
}

// SLURM's batch signal arrives twice, moments apart: one stop request, and the process lives to checkpoint.
TEST(StopRequest, CopiesWithinTwoSecondsAreOneRequest) {
  const Ending ending = signal_twice(SIGUSR1, SIGUSR1, 50ms);
  EXPECT_EQ(ending.status, SIGUSR1) << ending.describe();
}

// A second signal later on is the user insisting: the process dies of it, as without the handlers.
TEST(StopRequest, ASecondSignalLaterEndsTheProcess) {
  const Ending usr1 = signal_twice(SIGUSR1, SIGUSR1, 2500ms);
  EXPECT_EQ(usr1.status, 128 + SIGUSR1) << usr1.describe();
  const Ending term = signal_twice(SIGUSR1, SIGTERM, 2500ms);
  EXPECT_EQ(term.status, 128 + SIGTERM) << term.describe();
}

// The first signal alone is a request, never a kill; SIGTERM as SIGUSR1.
TEST(StopRequest, TheFirstSignalIsARequest) {
  const Ending ending = signal_twice(SIGTERM, 0, 10ms);  // signal 0 only checks that the child exists
  EXPECT_EQ(ending.status, SIGTERM) << ending.describe();
}

}  // namespace
}  // namespace dp::runtime
