#pragma once
// How ranks exchange the ring's messages. A message is a kind, the microbatch and step it belongs to, and a
// list of tensors (any may be undefined). The MPI transport stages tensors through host memory; an NCCL
// transport moves device buffers. Every wait is bounded: a peer that stays silent past the timeout, a
// failure reported by another rank, or a stop request ends the wait with an exception.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dp::runtime {

enum class MessageKind : int32_t {
  prompts = 1,      // coordinator -> first stage: prompt embeddings and pooled projection of a microbatch
  step = 2,         // coordinator -> first stage: latents, timestep, guidance
  activations = 3,  // stage -> next stage
  noise = 4,        // last stage -> coordinator: the noise prediction
  release = 5,      // a microbatch is finished: drop what was kept for it (flows round the ring)
  shutdown = 6,     // the run is over (flows round the ring)
  // The components' messages (--pipeline-device-map puts CLIP, T5 or the VAE on a rank other than 0):
  embeddings = 7,   // encoder rank -> coordinator: one chunk of prompts' CLIP pooled output or T5 embeddings
  decode = 8,       // coordinator -> decoding rank: a finished microbatch's final latents
  images = 9,       // decoding rank -> coordinator: that microbatch's 8-bit RGB images
};
constexpr int kMessageKinds = 9;
const char* message_kind_name(MessageKind kind);

struct Message {
  MessageKind kind = MessageKind::shutdown;
  int64_t microbatch = -1;
  int32_t step = -1;
  std::vector<at::Tensor> tensors;
  int source = -1;  // the rank it came from (set on receipt)
};

// Another rank failed and said why.
class RemoteFailure : public std::runtime_error {
 public:
  RemoteFailure(int rank, const std::string& reason)
      : std::runtime_error("rank " + std::to_string(rank) + " failed: " + reason), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// The device seconds one finished transfer took (a transport that times on the device reports these).
struct TransferSpan {
  int step = -1;  // the denoising step of the message; -1 for prompts, release and shutdown
  bool outbound = false;
  double seconds = 0;
};

// One finished all-to-all of this rank's sequence group: its step and its seconds, on the device when the
// transport times its transfers there, else on the host (staging included).
struct ExchangeSpan {
  int step = -1;
  double seconds = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Completes what construction began, before the first message or exchange: collective, so every rank calls
  // it at the same point of the run (runtime/run_context.h says where); a second call does nothing. The NCCL
  // transport's communicators are created in the background until then, while the rank loads and encodes.
  void connect();
  bool connected() const { return connected_; }
  // Queues `message` for `peer` and returns; the tensors are kept until delivered. Waits (bounded) only when
  // too many sends are pending.
  virtual void send(int peer, Message message) = 0;
  // The next message from `peer`, waiting at most the timeout; sends in progress keep moving meanwhile.
  virtual Message receive(int peer) = 0;
  // The next message from whichever of `peers` has one first (in order from each peer), waiting at most the
  // timeout in all; Message::source says which peer sent it.
  virtual Message receive_any(const std::vector<int>& peers) = 0;
  // Whether a message from `peer` has arrived (never waits).
  virtual bool has_message(int peer) = 0;
  // Waits (bounded) until every queued send has been delivered.
  virtual void flush() = 0;
  // Tells the coordinator that this rank failed; best effort, bounded by a few seconds.
  virtual void report_failure(const std::string& reason) = 0;
  // Bytes moved so far, for reports.
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
  // Whether send/receive seconds come from the device (CUDA events round each transfer) rather than the host.
  virtual bool times_transfers_on_device() const { return false; }
  // The spans of the transfers finished since the last call (device-timed transports only).
  virtual std::vector<TransferSpan> take_transfer_spans() { return {}; }

  // The all-to-all of this rank's sequence group, the ranks the transport was built with (runtime/mesh_layout.h):
  // send[j] goes to the group's j-th rank and recv[j] is filled from it (slot of this rank: a local copy).
  // Collective over the group, every member in the same order; bounded by the timeout like every wait, and a
  // failure reported by another rank ends it. `step` files its time under that denoising step. The transport may
  // return before the exchange is done when later work on this rank's device is ordered after it.
  virtual void all_to_all(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv, int step) = 0;
  // Waits (bounded) until every all-to-all started has finished, so that no later synchronisation of the device
  // can wait on a dead peer without a bound.
  virtual void finish_exchanges() {}
  // The all-to-alls finished since the last call.
  virtual std::vector<ExchangeSpan> take_exchange_spans() = 0;
  virtual uint64_t exchange_bytes_sent() const = 0;
  virtual uint64_t exchange_bytes_received() const = 0;

 protected:
  // What connect() runs, once; the MPI transport has nothing to finish.
  virtual void finish_connecting() {}
  // Throws an internal error naming `rank` and `call` when a message or an exchange comes before connect(). Every
  // transport keeps that order, so that the CPU runs over MPI check the order the NCCL transport needs.
  void check_connected(int rank, const char* call) const;

 private:
  bool connected_ = false;
};

}  // namespace dp::runtime
