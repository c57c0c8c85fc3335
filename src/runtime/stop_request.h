#pragma once
// Stop requests: SIGUSR1 or SIGTERM on any rank of a run with --checkpoint-dir stops the whole job at the next
// step boundary with a checkpoint, and every rank exits 75. Every rank catches the signals (so that a signal
// forwarded by mpirun, or sent by SLURM to every task, does not kill a stage); a rank other than 0 passes its
// request on to the coordinator from its wait loops (MPI may only be called there: the world is initialised
// MPI_THREAD_FUNNELED), and the coordinator looks for its own signal and the others' requests at each step
// boundary. A second signal to a process ends it at once, as without the handlers, unless it comes within 2 s of
// the first: batch systems often deliver one signal by two paths (stop_request.cpp says which).
#include <string>

#include "core/exit_codes.h"

namespace dp::runtime {

// The exit status of a job stopped by SIGUSR1/SIGTERM after writing its checkpoint (sysexits' EX_TEMPFAIL):
// batch scripts requeue on it.
inline constexpr int kExitCheckpointedAndStopped = kExitPreempted;

// Installs the SIGUSR1 and SIGTERM handlers that record a stop request in this process.
void install_stop_signal_handlers();
// The signal that asked this process to stop (SIGUSR1 or SIGTERM), 0 when none has.
int stop_signal();

// On a rank other than 0: sends this process's stop request to the coordinator once (non-blocking, never
// waits). Called from every wait loop (failure_channel.h); a no-op without a request, on rank 0 and without MPI.
void forward_stop_request(int rank);

// On the coordinator: the signal of the first stop request, its own or one a rank forwarded (0 when none),
// and which rank it came from. Never waits.
struct StopRequest {
  int signal = 0;
  int rank = 0;
  explicit operator bool() const { return signal != 0; }
  std::string describe() const;  // "SIGTERM on rank 2"
};
StopRequest stop_requested();

}  // namespace dp::runtime
