#pragma once
// How a failing rank tells the coordinator why, so the coordinator's log names the rank and the reason
// before the job ends: a short text on its own MPI tag, probed by rank 0 inside every wait it makes.
#include <string>

namespace dp::runtime {

// Best effort, bounded by a few seconds; a no-op on rank 0 and without MPI.
void report_failure_to_coordinator(int rank, const std::string& reason);
// On rank 0: throws RemoteFailure when a report has arrived. Elsewhere it passes this rank's stop request, if
// any, on to the coordinator (runtime/stop_request.h). Called from every wait loop.
void throw_if_a_rank_failed(int rank);

}  // namespace dp::runtime
