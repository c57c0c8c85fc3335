#include "runtime/nccl_transport.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <iomanip>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "runtime/failure_channel.h"
#include "runtime/wire_header.h"

namespace dp::runtime {
namespace {

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

std::string mpi_error_text(int code) {
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

}  // namespace

std::string nccl_loaded_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "NCCL (version unknown)";
  // Since 2.9 the code is major*10000 + minor*100 + patch.
  std::string text = str("NCCL ", code / 10000, ".", code / 100 % 100, ".", code % 100);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) != 0 && info.dli_fname != nullptr)
    text += str(" (", info.dli_fname, ")");
  return text;
}

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
  std::unique_ptr<Event> start, done;
  // Without a link to the peer the tensors go over MPI from host copies, kept alive until delivered.
  std::vector<at::Tensor> staged;
  std::vector<MPI_Request> payload_requests;
};

struct NcclTransport::Inbound {
  Message message;
  std::unique_ptr<Event> start, done;
};

struct NcclTransport::Exchange {
  int step = -1;
  std::unique_ptr<Event> start, done;
};

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

}  // namespace

NcclTransport::NcclTransport(int rank, int world_size, double timeout_seconds, const at::Device& device,
                             const std::vector<NcclLink>& links, const NcclGroup& group)
    : rank_(rank), world_size_(world_size), timeout_seconds_(timeout_seconds), device_(device) {
  DP_CHECK(timeout_seconds > 0, "--transport-timeout must be positive, got ", timeout_seconds);
  DP_CHECK(device.is_cuda() && device.has_index(), "rank ", rank, ": the NCCL transport needs a CUDA device, got ",
           device.str());
  c10::cuda::CUDAGuard guard(device_);
  for (const auto& link : links)
    DP_CHECK(link.from != link.to && link.from >= 0 && link.to >= 0 && link.from < world_size && link.to < world_size,
             "rank ", rank, ": bad NCCL link ", link.from, " -> ", link.to, " in a world of ", world_size);

  // Deadlock freedom: one communicator per direction of each boundary. In the ring every rank both sends to
  // its next and receives from its previous rank, at times that depend on compute, so sends and receives cannot
  // be paired in group calls. On one shared communicator a send stuck behind its receiver would hold up the
  // receive queued after it (NCCL runs a communicator's operations in order), and a ring of such sends waits
  // for ever. With a communicator and a stream per direction, a link's operations are only that link's, posted
  // in message order by both ends (the MPI headers arrive in order), so each send meets its receive.
  // One unique id per link and one per sequence group, all made by rank 0 and broadcast with a bounded wait.
  const bool grouped_ranks = group.ranks.size() > 1;
  if (grouped_ranks)
    DP_CHECK(group.index >= 0 && group.index < group.count &&
                 std::find(group.ranks.begin(), group.ranks.end(), rank) != group.ranks.end(),
             "rank ", rank, ": sequence group ", group.index, " of ", group.count, " (ranks ", rank_list(group.ranks),
             ") does not hold this rank");
  std::vector<ncclUniqueId> ids(links.size() + (grouped_ranks ? static_cast<size_t>(group.count) : 0));
  if (rank_ == 0)
    for (auto& id : ids) check_nccl(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
  if (!ids.empty()) {
    MPI_Request request = MPI_REQUEST_NULL;
    const int code = MPI_Ibcast(ids.data(), static_cast<int>(ids.size() * sizeof(ncclUniqueId)), MPI_BYTE, 0,
                                MPI_COMM_WORLD, &request);
    DP_CHECK(code == MPI_SUCCESS, "rank ", rank_, ": MPI_Ibcast of the NCCL ids failed: ", mpi_error_text(code));
    wait_until(
        [&] {
          int done = 0;
          const int tested = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
          DP_CHECK(tested == MPI_SUCCESS, "rank ", rank_, ": MPI_Test failed: ", mpi_error_text(tested));
          return done != 0;
        },
        "NCCL unique ids (broadcast)", 0);
  }

  // Non-blocking communicators, created together in one group: each init returns at once and is polled under
  // the timeout, so a rank that never joins cannot hang the others.
  std::vector<size_t> mine;  // indices into `links`, in the same order on every rank
  for (size_t i = 0; i < links.size(); ++i)
    if (links[i].from == rank_ || links[i].to == rank_) mine.push_back(i);
  for (size_t i : mine) {
    auto channel = std::make_unique<Channel>();
    channel->outbound = links[i].from == rank_;
    channel->peer = channel->outbound ? links[i].to : links[i].from;
    check_cuda(cudaStreamCreateWithFlags(&channel->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    channels_.push_back(std::move(channel));
  }
  if (grouped_ranks) {
    auto channel = std::make_unique<Channel>();
    channel->group = true;
    channel->ranks = group.ranks;
    channel->index = static_cast<int>(std::find(group.ranks.begin(), group.ranks.end(), rank) - group.ranks.begin());
    channels_.push_back(std::move(channel));
  }
  check_nccl(ncclGroupStart(), nullptr, "ncclGroupStart");
  if (grouped_ranks) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    Channel& channel = *channels_.back();
    const ncclResult_t result = ncclCommInitRankConfig(&channel.comm, static_cast<int>(channel.ranks.size()),
                                                       ids[links.size() + static_cast<size_t>(group.index)],
                                                       channel.index, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      ncclGroupEnd();
      check_nccl(result, &channel, "ncclCommInitRankConfig");
    }
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    Channel& channel = *channels_[k];
    const ncclResult_t result = ncclCommInitRankConfig(&channel.comm, 2, ids[mine[k]],
                                                       channel.outbound ? kSenderIndex : kReceiverIndex, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      ncclGroupEnd();
      check_nccl(result, &channel, "ncclCommInitRankConfig");
    }
  }
  const ncclResult_t grouped = ncclGroupEnd();
  if (grouped != ncclSuccess && grouped != ncclInProgress) check_nccl(grouped, nullptr, "ncclGroupEnd (init)");
  try {
    for (auto& channel : channels_) settle(*channel, "ncclCommInitRankConfig");
  } catch (const Error& e) {
    // The usual cause where ranks share a GPU: an NCCL older than 2.30, or the variable not set.
    DP_FAIL(e.what(), ". Ranks that share a GPU need NCCL 2.30 or newer with NCCL_MULTI_RANK_GPU_ENABLE=1 in "
            "their environment; --transport mpi needs neither");
  }

  // NCCL connects the two ends of a link on its first transfers, which needs both ends inside NCCL at once.
  // Doing it now for every link in one group (each rank in the same link order, so the rendezvous cannot form
  // a cycle), under the start-up timeout, keeps it out of the ring.
  std::vector<at::Tensor> probes;
  check_nccl(ncclGroupStart(), nullptr, "ncclGroupStart");
  for (auto& channel : channels_) {
    if (channel->group) continue;
    probes.push_back(at::empty({kConnectBytes}, at::TensorOptions().device(device_).dtype(at::kByte)));
    void* data = probes.back().data_ptr();
    const size_t bytes = static_cast<size_t>(kConnectBytes);
    const ncclResult_t result = channel->outbound
                                    ? ncclSend(data, bytes, ncclUint8, kReceiverIndex, channel->comm, channel->stream)
                                    : ncclRecv(data, bytes, ncclUint8, kSenderIndex, channel->comm, channel->stream);
    if (result != ncclSuccess && result != ncclInProgress) {
      ncclGroupEnd();
      check_nccl(result, channel.get(), channel->outbound ? "ncclSend (connect)" : "ncclRecv (connect)");
    }
  }
  const ncclResult_t connected = ncclGroupEnd();
  if (connected != ncclSuccess && connected != ncclInProgress) check_nccl(connected, nullptr, "ncclGroupEnd (connect)");
  for (auto& channel : channels_) {
    if (channel->group) continue;
    settle(*channel, "ncclGroupEnd (connect)");
    Event done(false);
    check_cuda(cudaEventRecord(done.event, channel->stream), "cudaEventRecord");
    wait_until([&] { return cudaEventQuery(done.event) == cudaSuccess; }, "NCCL connection", channel->peer);
  }

  // The group's connections likewise, with one small all-to-all once every link is up.
  if (grouped_ranks) {
    const int64_t members = static_cast<int64_t>(group.ranks.size());
    std::vector<at::Tensor> send, recv;
    for (int64_t j = 0; j < members; ++j) {
      send.push_back(at::zeros({kConnectBytes / members}, at::TensorOptions().device(device_).dtype(at::kByte)));
      recv.push_back(at::empty({kConnectBytes / members}, at::TensorOptions().device(device_).dtype(at::kByte)));
    }
    all_to_all_unguarded(send, recv, -1);
    finish_exchanges_unguarded();
    exchange_spans_.clear();
    exchange_bytes_sent_ = exchange_bytes_received_ = 0;
  }

  if (trace::recording()) make_trace_reference();
  // The first header of every inbound link is posted now, so a message can start arriving before it is asked for.
  for (auto& channel : channels_)
    if (!channel->outbound && !channel->group) post_receive(*channel);
  DP_DEBUG("rank ", rank_, ": NCCL transport ready, ", channels_.size() - (grouped_ranks ? 1 : 0), " link(s)",
           grouped_ranks ? str(" and sequence group ", group.index, " (ranks ", rank_list(group.ranks), ")") : "");
}

void NcclTransport::make_trace_reference() {
  cudaEvent_t reference = nullptr;
  check_cuda(cudaEventCreate(&reference), "cudaEventCreate (trace reference)");
  trace_reference_ = reference;
  check_cuda(cudaEventRecord(reference, at::cuda::getCurrentCUDAStream(device_.index()).stream()), "cudaEventRecord");
  wait_until([&] { return cudaEventQuery(reference) == cudaSuccess; }, "the trace's reference event", rank_);
  trace_reference_us_ = trace::now_us();
}

void NcclTransport::trace_transfer(cudaEvent_t start, float ms, bool outbound, const std::string& name) {
  float since_reference_ms = 0;
  if (trace_reference_ == nullptr || cudaEventElapsedTime(&since_reference_ms, trace_reference_, start) != cudaSuccess)
    return;
  trace::complete(outbound ? trace::Track::device_send : trace::Track::device_receive, name,
                  trace_reference_us_ + static_cast<int64_t>(since_reference_ms * 1e3), static_cast<int64_t>(ms * 1e3));
}

NcclTransport::~NcclTransport() {
  c10::cuda::CUDAGuard guard(device_);
  if (trace_reference_ != nullptr) cudaEventDestroy(trace_reference_);
  for (auto& channel : channels_)
    if (channel->header_request != MPI_REQUEST_NULL) {
      MPI_Cancel(&channel->header_request);
      MPI_Request_free(&channel->header_request);
    }
  for (auto& send : sends_)
    if (send->header_request != MPI_REQUEST_NULL) MPI_Request_free(&send->header_request);
  // A clean end (every send delivered, nothing half received) finalizes the communicators; anything else
  // aborts them, which never waits for a peer.
  bool clean = !aborted_ && sends_.empty() && exchange_ == nullptr;
  for (auto& channel : channels_) clean = clean && channel->arriving.empty();
  if (clean) {
    // Finalize flushes each communicator's own operations; all are started, then polled together, bounded.
    std::vector<ncclResult_t> states;
    for (auto& channel : channels_) states.push_back(ncclCommFinalize(channel->comm));
    const auto deadline = Clock::now() + std::chrono::duration<double>(std::min(timeout_seconds_, 10.0));
    for (size_t i = 0; i < channels_.size() && clean; ++i) {
      while (states[i] == ncclInProgress && Clock::now() < deadline) {
        if (ncclCommGetAsyncError(channels_[i]->comm, &states[i]) != ncclSuccess) break;
        if (states[i] == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      clean = states[i] == ncclSuccess;
    }
  }
  for (auto& channel : channels_) {
    if (channel->comm != nullptr) {
      if (clean) ncclCommDestroy(channel->comm);
      else if (!aborted_) ncclCommAbort(channel->comm);
    }
    channel->arriving.clear();
    if (channel->stream != nullptr) cudaStreamDestroy(channel->stream);
  }
  sends_.clear();
}

NcclTransport::Channel* NcclTransport::channel_to(int peer) {
  for (auto& c : channels_)
    if (!c->group && c->outbound && c->peer == peer) return c.get();
  return nullptr;
}

NcclTransport::Channel* NcclTransport::channel_from(int peer) {
  for (auto& c : channels_)
    if (!c->group && !c->outbound && c->peer == peer) return c.get();
  return nullptr;
}

NcclTransport::Channel* NcclTransport::group_channel() {
  for (auto& c : channels_)
    if (c->group) return c.get();
  return nullptr;
}

// The tensors are sent from their own storage, not a copy: the ring never changes a tensor in place after
// sending it (each step makes new ones), and this transport keeps a reference until the transfer is done.
void NcclTransport::send_unguarded(int peer, Message message) {
  DP_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": cannot send to rank ", peer);
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

void NcclTransport::report_failure(const std::string& reason) { report_failure_to_coordinator(rank_, reason); }

std::string NcclTransport::describe(const Channel& channel) {
  if (channel.group) return str("the sequence group (ranks ", rank_list(channel.ranks), ")");
  return str("the link ", channel.outbound ? "to" : "from", " rank ", channel.peer);
}

void NcclTransport::all_to_all(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv, int step) {
  guarded([&] { all_to_all_unguarded(send, recv, step); });
}

void NcclTransport::finish_exchanges() {
  guarded([&] { finish_exchanges_unguarded(); });
}

void NcclTransport::all_to_all_unguarded(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv,
                                         int step) {
  c10::cuda::CUDAGuard guard(device_);
  Channel* group = group_channel();
  DP_CHECK(group != nullptr && send.size() == group->ranks.size() && recv.size() == send.size(), "rank ", rank_,
           ": an all-to-all of ", send.size(), " parts without a sequence group of that size");
  for (size_t j = 0; j < send.size(); ++j)
    DP_CHECK(send[j].is_cuda() && recv[j].is_cuda() && send[j].is_contiguous() && recv[j].is_contiguous(), "rank ",
             rank_, ": all-to-all parts must be contiguous tensors on ", device_.str());
  // One exchange in flight: the host stays at most one all-to-all ahead of the device.
  finish_exchanges_unguarded();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device_.index()).stream();
  auto exchange = std::make_unique<Exchange>();
  exchange->step = step;
  exchange->start = std::make_unique<Event>(true);
  exchange->done = std::make_unique<Event>(true);
  if (exchange->start->event == nullptr || exchange->done->event == nullptr)
    fail(str("rank ", rank_, ": cudaEventCreate failed"));
  check_cuda(cudaEventRecord(exchange->start->event, stream), "cudaEventRecord");
  check_nccl(ncclGroupStart(), group, "ncclGroupStart");
  for (size_t j = 0; j < send.size(); ++j) {
    if (static_cast<int>(j) == group->index) continue;
    const size_t out_bytes = static_cast<size_t>(send[j].numel()) * send[j].element_size();
    const size_t in_bytes = static_cast<size_t>(recv[j].numel()) * recv[j].element_size();
    ncclResult_t result = ncclSend(send[j].data_ptr(), out_bytes, ncclUint8, static_cast<int>(j), group->comm, stream);
    if (result == ncclSuccess || result == ncclInProgress)
      result = ncclRecv(recv[j].data_ptr(), in_bytes, ncclUint8, static_cast<int>(j), group->comm, stream);
    if (result != ncclSuccess && result != ncclInProgress) {
      ncclGroupEnd();
      check_nccl(result, group, "ncclSend/ncclRecv (all-to-all)");
    }
    exchange_bytes_sent_ += out_bytes;
    exchange_bytes_received_ += in_bytes;
  }
  const ncclResult_t grouped = ncclGroupEnd();
  if (grouped != ncclInProgress) check_nccl(grouped, group, "ncclGroupEnd (all-to-all)");
  settle(*group, "ncclGroupEnd (all-to-all)");
  // This rank's own part, on the same stream.
  recv[static_cast<size_t>(group->index)].copy_(send[static_cast<size_t>(group->index)]);
  check_cuda(cudaEventRecord(exchange->done->event, stream), "cudaEventRecord");
  exchange_ = std::move(exchange);
}

void NcclTransport::finish_exchanges_unguarded() {
  if (exchange_ == nullptr) return;
  c10::cuda::CUDAGuard guard(device_);
  Channel* group = group_channel();
  wait_until(
      [&] {
        const cudaError_t state = cudaEventQuery(exchange_->done->event);
        if (state == cudaErrorNotReady) return false;
        check_cuda(state, "cudaEventQuery (all-to-all)");
        return true;
      },
      str("all-to-all of ", describe(*group)), -1);
  float ms = 0;
  if (cudaEventElapsedTime(&ms, exchange_->start->event, exchange_->done->event) == cudaSuccess)
    exchange_spans_.push_back({exchange_->step, ms / 1e3});
  exchange_.reset();
}

std::vector<ExchangeSpan> NcclTransport::take_exchange_spans() {
  std::vector<ExchangeSpan> out;
  out.swap(exchange_spans_);
  return out;
}

template <typename Done>
void NcclTransport::wait_until(Done&& done, const std::string& what, int peer) {
  const auto started = Clock::now();
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
    const double waited = std::chrono::duration<double>(Clock::now() - started).count();
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

void NcclTransport::settle(Channel& channel, const char* call) {
  const auto started = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(channel.comm, &state), &channel, "ncclCommGetAsyncError");
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) check_nccl(state, &channel, call);
    // A call still in progress may be NCCL connecting this link, which needs the peer inside NCCL too; the peer
    // may itself be waiting here for its own peer, so keep receiving meanwhile: a ring of ranks each waiting
    // in a send would otherwise wait for ever.
    progress();
    check_peers();
    if (std::chrono::duration<double>(Clock::now() - started).count() >= timeout_seconds_)
      fail(str("rank ", rank_, ": ", call, " on ", describe(channel), " did not complete within ", std::fixed,
               std::setprecision(0), timeout_seconds_, " s (--transport-timeout): ",
               channel.group ? std::string("a rank of the group") : str("rank ", channel.peer),
               " is stuck, dead or unreachable; NCCL communicators aborted"));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void NcclTransport::check_nccl(ncclResult_t result, Channel* channel, const char* call) {
  if (result == ncclSuccess) return;
  std::string detail = ncclGetErrorString(result);
  if (channel != nullptr && channel->comm != nullptr) {
    const char* last = ncclGetLastError(channel->comm);
    if (last != nullptr && *last != '\0') detail += str(": ", last);
  }
  fail(str("rank ", rank_, ": ", call, channel ? str(" on ", describe(*channel)) : std::string(), " failed: ", detail,
           " (", nccl_loaded_version(), "); NCCL communicators aborted"));
}

void NcclTransport::check_cuda(cudaError_t result, const char* call) {
  if (result == cudaSuccess) return;
  fail(str("rank ", rank_, ": ", call, " on ", device_.str(), " failed: ", cudaGetErrorString(result)));
}

void NcclTransport::check_peers() {
  try {
    throw_if_a_rank_failed(rank_);
  } catch (...) {
    abort_all();
    throw;
  }
}

void NcclTransport::fail(const std::string& message) {
  abort_all();
  DP_FAIL(message);
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

void NcclTransport::abort_all() noexcept {
  if (aborted_) return;
  aborted_ = true;
  for (auto& channel : channels_)
    if (channel->comm != nullptr) ncclCommAbort(channel->comm);
}

}  // namespace dp::runtime
