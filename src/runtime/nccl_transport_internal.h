#pragma once
// Internal to runtime: what the three parts of the NCCL transport share. nccl_transport_setup.cpp makes and
// ends the communicators and holds the bounded waits and the abort-on-error path; nccl_transport_messages.cpp
// the ring's point-to-point messages; nccl_transport_exchange.cpp the sequence group's all-to-alls. Users
// include runtime/nccl_transport.h.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/nccl_transport.h"

namespace dp::runtime {
namespace nccl_detail {

constexpr int kDataTag = 1;  // the ring's tag on MPI_COMM_WORLD, as the MPI transport's
constexpr size_t kMaxPendingSends = 16;
// Messages whose tensors a rank starts receiving before it is asked for them: enough to keep the transfers of
// the microbatches in flight going while this rank computes, few enough to bound the memory they take.
constexpr size_t kMaxPrepostedMessages = 4;
// The start-up transfer on every link. NCCL connects every channel to a peer on the first operation with that
// peer, whatever its size; a small one does it.
constexpr int64_t kConnectBytes = int64_t{1} << 20;
// In a two-rank link communicator the sender is rank 0 and the receiver rank 1.
constexpr int kSenderIndex = 0, kReceiverIndex = 1;

using Clock = std::chrono::steady_clock;

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

// A CUDA event owned by this transport; timing events measure transfers, the others only order streams.
struct Event {
  cudaEvent_t event = nullptr;
  explicit Event(bool timing) {
    if (cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming) != cudaSuccess)
      event = nullptr;
  }
  ~Event() {
    if (event != nullptr) cudaEventDestroy(event);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

inline std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

}  // namespace nccl_detail

// One direction of one ring boundary: a two-rank communicator, so that the operations on it are only this
// boundary's, in message order on both sides.
struct NcclTransport::Channel {
  int peer = -1;
  bool outbound = false;
  // The sequence group's communicator over its K ranks (this one at `index`) rather than a link; it runs on the
  // compute stream, so `stream` stays null.
  bool group = false;
  int index = 0;
  std::vector<int> ranks;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  // Inbound only: the header pre-posted for the next message, and the messages being received, oldest first.
  std::vector<int64_t> header_words;
  MPI_Request header_request = MPI_REQUEST_NULL;
  std::deque<std::unique_ptr<Inbound>> arriving;
};

struct NcclTransport::Outbound {
  int peer = -1;
  int step = -1;
  std::vector<int64_t> header;
  MPI_Request header_request = MPI_REQUEST_NULL;
  std::vector<at::Tensor> tensors;  // on the device, alive until the transfer finished
  std::unique_ptr<nccl_detail::Event> start, done;
  // Without a link to the peer the tensors go over MPI from host copies, kept alive until delivered.
  std::vector<at::Tensor> staged;
  std::vector<MPI_Request> payload_requests;
};

struct NcclTransport::Inbound {
  Message message;
  std::unique_ptr<nccl_detail::Event> start, done;
};

struct NcclTransport::Exchange {
  int step = -1;
  std::unique_ptr<nccl_detail::Event> start, done;
};

// Member templates used by every part, so defined where all of them see them.

template <typename Done>
void NcclTransport::wait_until(Done&& done, const std::string& what, int peer) {
  const auto started = nccl_detail::Clock::now();
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    if (done()) return;
    progress();
    check_peers();
    for (auto& channel : channels_) {
      ncclResult_t state = ncclSuccess;
      if (channel->comm != nullptr && ncclCommGetAsyncError(channel->comm, &state) == ncclSuccess &&
          state != ncclSuccess && state != ncclInProgress)
        check_nccl(state, channel.get(), "a transfer");
    }
    const double waited = std::chrono::duration<double>(nccl_detail::Clock::now() - started).count();
    if (waited >= timeout_seconds_)
      fail(str("rank ", rank_, ": no ", what, peer >= 0 ? str(" from rank ", peer) : std::string(), " within ",
               std::fixed, std::setprecision(0), timeout_seconds_, " s (--transport-timeout): ",
               peer >= 0 ? str("rank ", peer) : std::string("a rank of the sequence group"),
               " is stuck, dead or unreachable; NCCL communicators aborted"));
    // Back off to a millisecond: ranks sharing a GPU and few cores must not starve each other by spinning.
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

template <typename Work>
void NcclTransport::guarded(Work&& work) {
  try {
    work();
  } catch (...) {
    abort_all();  // whatever failed (a malformed header, CUDA, MPI, a peer's report), no communicator outlives it
    throw;
  }
}

}  // namespace dp::runtime
