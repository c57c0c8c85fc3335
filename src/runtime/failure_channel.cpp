#include "runtime/failure_channel.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "runtime/stop_request.h"
#include "runtime/transport.h"

namespace dp::runtime {
namespace {
constexpr int kFailureTag = 2;  // kDataTag (1) carries the ring's messages

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}
}  // namespace

void report_failure_to_coordinator(int rank, const std::string& reason) {
  if (rank == 0 || !mpi_running()) return;
  const std::string text = reason.substr(0, 4000);
  MPI_Request request;
  if (MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, 0, kFailureTag, MPI_COMM_WORLD, &request) !=
      MPI_SUCCESS)
    return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!done) MPI_Request_free(&request);
}

void throw_if_a_rank_failed(int rank) {
  // Every wait loop passes here: a stage rank's own stop signal goes to the coordinator from here (issue 21).
  if (rank != 0) forward_stop_request(rank);
  if (rank != 0 || !mpi_running()) return;
  int flag = 0;
  MPI_Status status;
  if (MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, MPI_COMM_WORLD, &flag, &status) != MPI_SUCCESS || !flag) return;
  int count = 0;
  MPI_Get_count(&status, MPI_CHAR, &count);
  std::string reason(static_cast<size_t>(std::max(count, 0)), '\0');
  MPI_Recv(reason.data(), count, MPI_CHAR, status.MPI_SOURCE, kFailureTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  throw RemoteFailure(status.MPI_SOURCE, reason);
}

}  // namespace dp::runtime
