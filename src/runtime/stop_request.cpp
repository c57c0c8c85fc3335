#include "runtime/stop_request.h"

#include <ctime>

#include <mpi.h>
#include <signal.h>

#include <string>

#include "core/error.h"
#include "core/log.h"

namespace dp::runtime {
namespace {

// kDataTag (1) carries the ring's messages, kFailureTag (2) the failure reports.
constexpr int kStopTag = 3;

volatile sig_atomic_t g_stop_signal = 0;
// When the first signal came (CLOCK_MONOTONIC, whole seconds and nanoseconds: clock_gettime is
// async-signal-safe). One signal often arrives twice within moments: `scancel --signal=USR1 --batch` reaches the
// batch shell and its children, srun among them, and the shell's trap forwards it to srun again, which passes both
// to every task. Copies within kDuplicateSeconds are the same request; a later one is the user insisting.
constexpr double kDuplicateSeconds = 2.0;
timespec g_first_signal_at{};
bool g_forwarded = false;
StopRequest g_first_request;  // coordinator: the request acted on

void on_stop_signal(int signal_number) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  if (g_stop_signal != 0) {
    const double since_first = static_cast<double>(now.tv_sec - g_first_signal_at.tv_sec) +
                               static_cast<double>(now.tv_nsec - g_first_signal_at.tv_nsec) * 1e-9;
    if (since_first < kDuplicateSeconds) return;  // another copy of the same request
    // A second signal later on: the user (or the batch system) insists. Die of it as without the handler.
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
    return;
  }
  g_first_signal_at = now;
  g_stop_signal = signal_number;
}

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

std::string signal_name(int s) { return s == SIGUSR1 ? "SIGUSR1" : s == SIGTERM ? "SIGTERM" : std::to_string(s); }

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGUSR1, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

int stop_signal() { return g_stop_signal; }

void forward_stop_request(int rank) {
  if (rank == 0 || g_forwarded || g_stop_signal == 0 || !mpi_running()) return;
  g_forwarded = true;
  static int signal_number = 0;  // must outlive the send
  signal_number = g_stop_signal;
  MPI_Request request;
  if (MPI_Isend(&signal_number, 1, MPI_INT, 0, kStopTag, MPI_COMM_WORLD, &request) != MPI_SUCCESS) return;
  // Delivered without anyone waiting for it: the coordinator takes it at its next step boundary.
  MPI_Request_free(&request);
  DP_WARN("stop requested by ", signal_name(signal_number), " on this rank: asking rank 0 to checkpoint and stop "
          "every rank at the next step boundary");
}

StopRequest stop_requested() {
  if (g_first_request) return g_first_request;
  if (g_stop_signal != 0) {
    g_first_request = {g_stop_signal, 0};
    return g_first_request;
  }
  if (!mpi_running()) return {};
  // Every request that has arrived is taken (several ranks may have been signalled); the first one counts.
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kStopTag, MPI_COMM_WORLD, &arrived, &status) != MPI_SUCCESS || !arrived) break;
    int signal_number = 0;
    MPI_Recv(&signal_number, 1, MPI_INT, status.MPI_SOURCE, kStopTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (!g_first_request) g_first_request = {signal_number, status.MPI_SOURCE};
  }
  return g_first_request;
}

std::string StopRequest::describe() const { return str(signal_name(signal), " on rank ", rank); }

}  // namespace dp::runtime
