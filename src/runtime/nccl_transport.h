#pragma once
// The ring's messages with their tensors moved device to device by NCCL; only built with DIFFPIPE_HAVE_NCCL.
// The control part of a message (kind, microbatch, step, dtypes, shapes) is the wire header of
// runtime/wire_header.h and still travels over MPI, so the receiver knows what to receive before it posts
// its NCCL receives.
//
// Streams: each link has its own CUDA stream. A send makes the link's stream wait on an event recorded on the
// sender's compute stream (the tensor is ready), and a receive returns only once the transfer's completion
// event has fired, after making the receiver's compute stream wait on it. No device-wide synchronisation.
//
// Every wait polls (MPI requests, CUDA events, the communicators' async state) at most the transport
// timeout; a failure reported by another rank also ends it. On an error or a timeout every communicator is
// aborted (ncclCommAbort) before the exception that names the rank and NCCL's error leaves.
//
// A sequence group (runtime/mesh_layout.h) has one more communicator, over its K ranks, for the all-to-alls
// around attention: grouped ncclSend/ncclRecv on the compute stream, since the attention that follows needs
// their result anyway. At most one is in flight: the next one, or finish_exchanges(), first waits (bounded)
// for the previous one's completion event, so the host runs ahead of the device by one exchange and a dead
// peer is noticed within the timeout rather than in some later synchronisation.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "runtime/transport.h"

namespace dp::runtime {

// A directed ring boundary that carries tensors: `from` sends, `to` receives.
struct NcclLink {
  int from = 0, to = 0;
};

// This rank's sequence group: its index among the world's `count` groups (all of one size) and its world ranks
// in shard order. Empty ranks (or one): no group communicator.
struct NcclGroup {
  int index = 0;
  int count = 0;
  std::vector<int> ranks;
};

// "NCCL 2.30.7 (/path/libnccl.so.2)": the library this process actually loaded.
std::string nccl_loaded_version();

class NcclTransport : public Transport {
 public:
  // Collective over MPI_COMM_WORLD: every rank passes the same `links`, and its own `group`. `device` is this
  // rank's GPU. Returns once rank 0's ids have reached this rank and the communicators' creation has begun in
  // NCCL's background; connect() completes it.
  NcclTransport(int rank, int world_size, double timeout_seconds, const at::Device& device,
                const std::vector<NcclLink>& links, const NcclGroup& group = {});
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  void send(int peer, Message message) override;
  Message receive(int peer) override;
  Message receive_any(const std::vector<int>& peers) override;
  bool has_message(int peer) override;
  void flush() override;
  void report_failure(const std::string& reason) override;
  uint64_t bytes_sent() const override { return bytes_sent_; }
  uint64_t bytes_received() const override { return bytes_received_; }
  bool times_transfers_on_device() const override { return true; }
  std::vector<TransferSpan> take_transfer_spans() override;
  void all_to_all(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv, int step) override;
  void finish_exchanges() override;
  std::vector<ExchangeSpan> take_exchange_spans() override;
  uint64_t exchange_bytes_sent() const override { return exchange_bytes_sent_; }
  uint64_t exchange_bytes_received() const override { return exchange_bytes_received_; }

 protected:
  // Waits (bounded) for the communicators, connects every link and the group, and posts the first receives.
  void finish_connecting() override;

 private:
  struct Channel;   // one communicator, one stream, one peer
  struct Outbound;  // a send in flight
  struct Inbound;   // a message whose tensors are being received
  struct Exchange;  // an all-to-all in flight

  void send_unguarded(int peer, Message message);
  Message receive_unguarded(int peer);
  // A message from a rank with no NCCL link to this one (the components' messages between ranks that are not
  // ring neighbours, a shutdown to an idle rank): header and tensors over MPI, tensors arriving on the host.
  Message receive_over_mpi(int peer);
  void flush_unguarded();
  void all_to_all_unguarded(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv, int step);
  void finish_exchanges_unguarded();
  // The group's communicator (a Channel marked `group`), or null.
  Channel* group_channel();
  // "the link to rank 3", "the sequence group (ranks 2, 3)": for messages.
  static std::string describe(const Channel& channel);
  // Runs `work`; on any exception aborts every communicator before it propagates.
  template <typename Work>
  void guarded(Work&& work);
  Channel* channel_to(int peer);
  Channel* channel_from(int peer);
  // Moves finished sends out of the queue and starts receiving any message whose header has arrived.
  void progress();
  void post_receive(Channel& channel);
  bool send_finished(Outbound& send);
  // Polls `done` until true, at most the timeout; `what` and `peer` name the wait in the error (peer -1: a rank
  // of the sequence group).
  template <typename Done>
  void wait_until(Done&& done, const std::string& what, int peer);
  // Waits (bounded) until no NCCL call on `comm` is still in progress; throws on its async error.
  void settle(Channel& channel, const char* call);
  void check_nccl(ncclResult_t result, Channel* channel, const char* call);
  void check_cuda(cudaError_t result, const char* call);
  void check_peers();
  // Aborts every communicator (idempotent) and throws `message`.
  [[noreturn]] void fail(const std::string& message);
  void abort_all() noexcept;
  // --trace: the transfers' CUDA-event times placed on the host timeline through one reference event that the
  // host saw complete at trace_reference_us_ (as ComputeClock does for compute).
  void make_trace_reference();
  void trace_transfer(cudaEvent_t start, float ms, bool outbound, const std::string& name);

  int rank_, world_size_;
  double timeout_seconds_;
  at::Device device_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::deque<std::unique_ptr<Outbound>> sends_;
  std::vector<TransferSpan> spans_;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  std::unique_ptr<Exchange> exchange_;  // the all-to-all in flight
  std::vector<ExchangeSpan> exchange_spans_;
  uint64_t exchange_bytes_sent_ = 0, exchange_bytes_received_ = 0;
  bool aborted_ = false;
  double ids_seconds_ = 0;  // the constructor's wait for rank 0's ids, for connect()'s log line
  bool progressing_ = false;
  cudaEvent_t trace_reference_ = nullptr;
  int64_t trace_reference_us_ = 0;  // progress() runs inside waits that progress() itself may start
};

}  // namespace dp::runtime
