// The ring's point-to-point messages over the NCCL transport: headers over MPI, tensors over the link's
// communicator on its own stream (or over MPI where two ranks share no link), received ahead of being asked for.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>

#include "core/trace.h"
#include "runtime/nccl_transport_internal.h"
#include "runtime/wire_header.h"

namespace dp::runtime {

using namespace nccl_detail;

// The tensors are sent from their own storage, not a copy: the ring never changes a tensor in place after
// sending it (each step makes new ones), and this transport keeps a reference until the transfer is done.
void NcclTransport::send_unguarded(int peer, Message message) {
  DP_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": cannot send to rank ", peer);
  check_connected(rank_, "send");
  c10::cuda::CUDAGuard guard(device_);
  auto out = std::make_unique<Outbound>();
  out->peer = peer;
  out->step = message.step;
  out->header = wire::encode(message, rank_);
  for (const auto& t : message.tensors)
    if (t.defined() && t.numel() > 0) out->tensors.push_back(t.to(device_).contiguous());
  Channel* channel = channel_to(peer);
  if (channel == nullptr) {
    // Not a ring boundary (an encoder's embeddings, latents for the decoding rank, its images): these are
    // few and small next to the activations, so they are staged through the host over MPI, as the MPI
    // transport does. Both ends know the links, so the receiver looks for them there too.
    for (auto& t : out->tensors) {
      out->staged.push_back(t.to(at::kCPU).contiguous());
      const int64_t bytes = out->staged.back().numel() * static_cast<int64_t>(out->staged.back().element_size());
      DP_CHECK(bytes <= std::numeric_limits<int>::max(), "rank ", rank_, ": a ", message_kind_name(message.kind),
               " tensor of ", bytes, " bytes for rank ", peer, " is too large for one MPI message off the ring");
    }
    out->tensors.clear();
  }

  // The header first: the receiver posts its NCCL receives when it reads it.
  const int code = MPI_Isend(out->header.data(), wire::kHeaderWords, MPI_INT64_T, peer, kDataTag, MPI_COMM_WORLD,
                             &out->header_request);
  if (code != MPI_SUCCESS) fail(str("rank ", rank_, ": MPI_Isend (header to rank ", peer, ") failed: ", mpi_error_text(code)));
  for (auto& t : out->staged) {
    out->payload_requests.emplace_back(MPI_REQUEST_NULL);
    const int bytes = static_cast<int>(t.numel() * static_cast<int64_t>(t.element_size()));
    const int sent = MPI_Isend(t.data_ptr(), bytes, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD,
                               &out->payload_requests.back());
    if (sent != MPI_SUCCESS) fail(str("rank ", rank_, ": MPI_Isend (tensor to rank ", peer, ") failed: ", mpi_error_text(sent)));
    bytes_sent_ += static_cast<uint64_t>(bytes);
  }
  if (!out->tensors.empty()) {
    // The link's stream starts when the compute stream has produced the tensors, not before, and not by a sync.
    Event ready(false);
    out->start = std::make_unique<Event>(true);
    out->done = std::make_unique<Event>(true);
    if (ready.event == nullptr || out->start->event == nullptr || out->done->event == nullptr)
      fail(str("rank ", rank_, ": cudaEventCreate failed"));
    check_cuda(cudaEventRecord(ready.event, at::cuda::getCurrentCUDAStream(device_.index()).stream()), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(channel->stream, ready.event, 0), "cudaStreamWaitEvent");
    check_cuda(cudaEventRecord(out->start->event, channel->stream), "cudaEventRecord");
    check_nccl(ncclGroupStart(), channel, "ncclGroupStart");
    for (const auto& t : out->tensors) {
      const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
      const ncclResult_t result = ncclSend(t.data_ptr(), bytes, ncclUint8, kReceiverIndex, channel->comm, channel->stream);
      if (result != ncclSuccess && result != ncclInProgress) {
        ncclGroupEnd();
        check_nccl(result, channel, "ncclSend");
      }
      bytes_sent_ += bytes;
    }
    const ncclResult_t grouped = ncclGroupEnd();
    if (grouped != ncclInProgress) check_nccl(grouped, channel, "ncclGroupEnd (send)");
    settle(*channel, "ncclSend");
    check_cuda(cudaEventRecord(out->done->event, channel->stream), "cudaEventRecord");
  }
  sends_.push_back(std::move(out));
  progress();
  while (sends_.size() > kMaxPendingSends) {
    wait_until([&] { return send_finished(*sends_.front()); }, "delivery of a message", sends_.front()->peer);
    sends_.pop_front();
  }
}

bool NcclTransport::send_finished(Outbound& out) {
  if (out.header_request != MPI_REQUEST_NULL) {
    int done = 0;
    const int code = MPI_Test(&out.header_request, &done, MPI_STATUS_IGNORE);
    if (code != MPI_SUCCESS) fail(str("rank ", rank_, ": MPI_Test (header to rank ", out.peer, ") failed: ", mpi_error_text(code)));
    if (!done) return false;
  }
  if (!out.payload_requests.empty()) {
    int done = 0;
    const int code = MPI_Testall(static_cast<int>(out.payload_requests.size()), out.payload_requests.data(), &done,
                                 MPI_STATUSES_IGNORE);
    if (code != MPI_SUCCESS) fail(str("rank ", rank_, ": MPI_Testall (tensors to rank ", out.peer, ") failed: ", mpi_error_text(code)));
    if (!done) return false;
    out.payload_requests.clear();
    out.staged.clear();
  }
  if (out.done) {
    const cudaError_t state = cudaEventQuery(out.done->event);
    if (state == cudaErrorNotReady) return false;
    check_cuda(state, "cudaEventQuery (send)");
    float ms = 0;
    if (cudaEventElapsedTime(&ms, out.start->event, out.done->event) == cudaSuccess) {
      spans_.push_back({out.step, true, ms / 1e3});
      if (trace_reference_ != nullptr)
        trace_transfer(out.start->event, ms, true,
                       str("NCCL send", out.step >= 0 ? str(" step ", out.step + 1) : std::string(), " to rank ", out.peer));
    }
    out.done.reset();
    out.tensors.clear();
  }
  return true;
}

void NcclTransport::post_receive(Channel& channel) {
  channel.header_words.assign(wire::kHeaderWords, 0);
  const int code = MPI_Irecv(channel.header_words.data(), wire::kHeaderWords, MPI_INT64_T, channel.peer, kDataTag,
                             MPI_COMM_WORLD, &channel.header_request);
  if (code != MPI_SUCCESS)
    fail(str("rank ", rank_, ": MPI_Irecv (header from rank ", channel.peer, ") failed: ", mpi_error_text(code)));
}

void NcclTransport::progress() {
  if (progressing_) return;
  progressing_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{progressing_};
  while (!sends_.empty() && send_finished(*sends_.front())) sends_.pop_front();
  for (auto& channel_ptr : channels_) {
    Channel& channel = *channel_ptr;
    if (channel.outbound || channel.group) continue;
    // A header that has arrived: receive its tensors now, into fresh buffers, while this rank computes.
    while (channel.header_request != MPI_REQUEST_NULL && channel.arriving.size() < kMaxPrepostedMessages) {
      int done = 0;
      const int code = MPI_Test(&channel.header_request, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS)
        fail(str("rank ", rank_, ": MPI_Test (header from rank ", channel.peer, ") failed: ", mpi_error_text(code)));
      if (!done) break;
      const wire::Header header = wire::decode(channel.header_words, rank_, channel.peer);
      auto in = std::make_unique<Inbound>();
      in->message = {header.kind, header.microbatch, header.step, {}, channel.peer};
      std::vector<at::Tensor> targets;
      for (const auto& spec : header.tensors) {
        if (!spec.defined) {
          in->message.tensors.emplace_back();
          continue;
        }
        at::Tensor t = at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype).device(device_));
        if (t.numel() > 0) targets.push_back(t);
        in->message.tensors.push_back(std::move(t));
      }
      if (!targets.empty()) {
        in->start = std::make_unique<Event>(true);
        in->done = std::make_unique<Event>(true);
        if (in->start->event == nullptr || in->done->event == nullptr) fail(str("rank ", rank_, ": cudaEventCreate failed"));
        // The buffers belong to the compute stream's pool; the link's stream writes them, so the allocator must
        // not hand them out again before that stream is done with them.
        const auto link_stream = c10::cuda::getStreamFromExternal(channel.stream, device_.index());
        // The buffers may reuse memory that kernels still queued on the compute stream were using (the allocator
        // hands a block back as soon as the host drops its tensor, ordered on the compute stream alone): the
        // link's stream must not write into them before that work is done.
        Event allocated(false);
        if (allocated.event == nullptr) fail(str("rank ", rank_, ": cudaEventCreate failed"));
        check_cuda(cudaEventRecord(allocated.event, at::cuda::getCurrentCUDAStream(device_.index()).stream()),
                   "cudaEventRecord");
        check_cuda(cudaStreamWaitEvent(channel.stream, allocated.event, 0), "cudaStreamWaitEvent");
        check_cuda(cudaEventRecord(in->start->event, channel.stream), "cudaEventRecord");
        check_nccl(ncclGroupStart(), &channel, "ncclGroupStart");
        for (const auto& t : targets) {
          c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), link_stream);
          const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
          const ncclResult_t result = ncclRecv(t.data_ptr(), bytes, ncclUint8, kSenderIndex, channel.comm, channel.stream);
          if (result != ncclSuccess && result != ncclInProgress) {
            ncclGroupEnd();
            check_nccl(result, &channel, "ncclRecv");
          }
          bytes_received_ += bytes;
        }
        const ncclResult_t grouped = ncclGroupEnd();
        if (grouped != ncclInProgress) check_nccl(grouped, &channel, "ncclGroupEnd (receive)");
        settle(channel, "ncclRecv");
        check_cuda(cudaEventRecord(in->done->event, channel.stream), "cudaEventRecord");
      }
      channel.arriving.push_back(std::move(in));
      post_receive(channel);
    }
  }
}

Message NcclTransport::receive_unguarded(int peer) {
  DP_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": cannot receive from rank ", peer);
  check_connected(rank_, "receive");
  c10::cuda::CUDAGuard guard(device_);
  Channel* channel = channel_from(peer);
  if (channel == nullptr) return receive_over_mpi(peer);
  wait_until(
      [&] {
        progress();
        return !channel->arriving.empty();
      },
      "message", peer);
  std::unique_ptr<Inbound> in = std::move(channel->arriving.front());
  channel->arriving.pop_front();
  if (in->done) {
    // Bounded on the host as well: a compute stream left waiting on a transfer from a dead rank would hang the
    // first synchronisation after it, where no timeout applies.
    wait_until([&] {
      const cudaError_t state = cudaEventQuery(in->done->event);
      if (state == cudaErrorNotReady) return false;
      check_cuda(state, "cudaEventQuery (receive)");
      return true;
    }, str(message_kind_name(in->message.kind), " tensors"), peer);
    check_cuda(cudaStreamWaitEvent(at::cuda::getCurrentCUDAStream(device_.index()).stream(), in->done->event, 0),
               "cudaStreamWaitEvent");
    float ms = 0;
    if (cudaEventElapsedTime(&ms, in->start->event, in->done->event) == cudaSuccess) {
      spans_.push_back({in->message.step, false, ms / 1e3});
      if (trace_reference_ != nullptr)
        trace_transfer(in->start->event, ms, false,
                       str("NCCL receive ", message_kind_name(in->message.kind),
                           in->message.microbatch >= 0 ? str(" mb ", in->message.microbatch) : std::string(),
                           in->message.step >= 0 ? str(" step ", in->message.step + 1) : std::string(), " from rank ",
                           peer));
    }
  }
  return std::move(in->message);
}

Message NcclTransport::receive_over_mpi(int peer) {
  std::vector<int64_t> words(wire::kHeaderWords, 0);
  MPI_Request request = MPI_REQUEST_NULL;
  const int code = MPI_Irecv(words.data(), wire::kHeaderWords, MPI_INT64_T, peer, kDataTag, MPI_COMM_WORLD, &request);
  if (code != MPI_SUCCESS) fail(str("rank ", rank_, ": MPI_Irecv (header) failed: ", mpi_error_text(code)));
  wait_until(
      [&] {
        int done = 0;
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        return done != 0;
      },
      "message", peer);
  const wire::Header header = wire::decode(words, rank_, peer);  // checked before anything is allocated
  Message message{header.kind, header.microbatch, header.step, {}, peer};
  std::vector<MPI_Request> requests;
  for (const auto& spec : header.tensors) {
    if (!spec.defined) {
      message.tensors.emplace_back();
      continue;
    }
    at::Tensor t = at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype));
    const int64_t bytes = spec.bytes();
    DP_CHECK(bytes <= std::numeric_limits<int>::max(), "rank ", rank_, ": malformed message from rank ", peer, ": a ",
             bytes, "-byte tensor off the ring");
    if (bytes > 0) {
      requests.emplace_back(MPI_REQUEST_NULL);
      const int posted = MPI_Irecv(t.data_ptr(), static_cast<int>(bytes), MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD,
                                   &requests.back());
      if (posted != MPI_SUCCESS) fail(str("rank ", rank_, ": MPI_Irecv (tensor) failed: ", mpi_error_text(posted)));
      bytes_received_ += static_cast<uint64_t>(bytes);
    }
    message.tensors.push_back(std::move(t));
  }
  if (!requests.empty())
    wait_until(
        [&] {
          int done = 0;
          MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
          return done != 0;
        },
        str(message_kind_name(message.kind), " tensors"), peer);
  return message;
}

bool NcclTransport::has_message(int peer) {
  DP_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": cannot receive from rank ", peer);
  check_connected(rank_, "has_message");
  bool found = false;
  guarded([&] {
    c10::cuda::CUDAGuard guard(device_);
    if (Channel* channel = channel_from(peer)) {
      // The link's header receive is always posted, so a probe would not see it: look at what progress took.
      progress();
      found = !channel->arriving.empty();
      return;
    }
    int arrived = 0;
    const int code = MPI_Iprobe(peer, kDataTag, MPI_COMM_WORLD, &arrived, MPI_STATUS_IGNORE);
    if (code != MPI_SUCCESS) fail(str("rank ", rank_, ": MPI_Iprobe failed: ", mpi_error_text(code)));
    found = arrived != 0;
  });
  return found;
}

Message NcclTransport::receive_any(const std::vector<int>& peers) {
  DP_CHECK(!peers.empty(), "rank ", rank_, ": receive from no rank");
  if (peers.size() == 1) return receive(peers.front());
  // Take a message only from a peer that has one, rotating so that a busy peer cannot starve another; each
  // peer's messages stay in order.
  int ready = -1;
  size_t turn = 0;
  guarded([&] {
    wait_until(
        [&] {
          for (size_t i = 0; i < peers.size(); ++i) {
            const int peer = peers[(turn + i) % peers.size()];
            if (has_message(peer)) {
              ready = peer;
              return true;
            }
          }
          ++turn;
          return false;
        },
        "message", peers.front());
  });
  return receive(ready);
}

void NcclTransport::send(int peer, Message message) {
  guarded([&] { send_unguarded(peer, std::move(message)); });
}

Message NcclTransport::receive(int peer) {
  Message message;
  guarded([&] { message = receive_unguarded(peer); });
  return message;
}

void NcclTransport::flush() {
  guarded([&] { flush_unguarded(); });
}

void NcclTransport::flush_unguarded() {
  c10::cuda::CUDAGuard guard(device_);
  finish_exchanges_unguarded();
  while (!sends_.empty()) {
    wait_until([&] { return send_finished(*sends_.front()); }, "delivery of a message", sends_.front()->peer);
    sends_.pop_front();
  }
}

std::vector<TransferSpan> NcclTransport::take_transfer_spans() {
  c10::cuda::CUDAGuard guard(device_);
  guarded([&] { progress(); });
  std::vector<TransferSpan> out;
  out.swap(spans_);
  return out;
}

void NcclTransport::trace_transfer(cudaEvent_t start, float ms, bool outbound, const std::string& name) {
  float since_reference_ms = 0;
  if (trace_reference_ == nullptr || cudaEventElapsedTime(&since_reference_ms, trace_reference_, start) != cudaSuccess)
    return;
  trace::complete(outbound ? trace::Track::device_send : trace::Track::device_receive, name,
                  trace_reference_us_ + static_cast<int64_t>(since_reference_ms * 1e3), static_cast<int64_t>(ms * 1e3));
}

}  // namespace dp::runtime
