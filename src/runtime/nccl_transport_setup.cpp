// The NCCL transport's communicators: made (with their connections) under the start-up timeout, finalized or
// aborted at the end, and the bounded waits and error checks that abort them all before an error leaves.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <dlfcn.h>

#include "core/log.h"
#include "core/trace.h"
#include "runtime/failure_channel.h"
#include "runtime/nccl_transport_internal.h"

namespace dp::runtime {

using namespace nccl_detail;

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

NcclTransport::NcclTransport(int rank, int world_size, double timeout_seconds, const at::Device& device,
                             const std::vector<NcclLink>& links, const NcclGroup& group)
    : rank_(rank), world_size_(world_size), timeout_seconds_(timeout_seconds), device_(device) {
  DP_CHECK(timeout_seconds > 0, "--transport-timeout must be positive, got ", timeout_seconds);
  DP_CHECK(device.is_cuda() && device.has_index(), "rank ", rank, ": the NCCL transport needs a CUDA device, got ",
           device.str());
  c10::cuda::CUDAGuard guard(device_);
  const auto setup_started = Clock::now();
  const auto since_start = [&setup_started] {
    return std::chrono::duration<double>(Clock::now() - setup_started).count();
  };
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
  ids_seconds_ = since_start();

  // Non-blocking communicators, created together in one group: each init returns at once and NCCL goes on
  // creating them in its own threads while this rank loads and encodes; connect() polls them under the timeout,
  // so a rank that never joins cannot hang the others.
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
  DP_DEBUG("rank ", rank_, ": NCCL communicators being created in the background (ids in ", std::fixed,
           std::setprecision(3), ids_seconds_, " s)");
}

void NcclTransport::finish_connecting() {
  c10::cuda::CUDAGuard guard(device_);
  const auto connect_started = Clock::now();
  const auto since_start = [&connect_started] {
    return std::chrono::duration<double>(Clock::now() - connect_started).count();
  };
  const bool grouped_ranks = group_channel() != nullptr;
  try {
    for (auto& channel : channels_) settle(*channel, "ncclCommInitRankConfig");
  } catch (const Error& e) {
    // The usual cause where ranks share a GPU: an NCCL older than 2.30, or the variable not set.
    DP_FAIL(e.what(), ". Ranks that share a GPU need NCCL 2.30 or newer with NCCL_MULTI_RANK_GPU_ENABLE=1 in "
            "their environment; --transport mpi needs neither");
  }
  const double init_wait_seconds = since_start();

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
    const int64_t members = static_cast<int64_t>(group_channel()->ranks.size());
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
  // Where the start-up goes: rank 0's ids reaching every rank (at construction), what was left of the
  // communicators' creation when this rank came to connect, and the connections themselves.
  const Channel* group = group_channel();
  const double connect_seconds = since_start();
  DP_DEBUG("rank ", rank_, ": NCCL transport ready, ", channels_.size() - (group ? 1 : 0), " link(s)",
           group ? str(" and a sequence group (ranks ", rank_list(group->ranks), ")") : "", ", ", std::fixed,
           std::setprecision(3), connect_seconds, " s after the run asked for it (ids ", ids_seconds_,
           " s at the start, the communicators' creation then ", init_wait_seconds, " s more, connections ",
           connect_seconds - init_wait_seconds, " s)");
}

void NcclTransport::make_trace_reference() {
  cudaEvent_t reference = nullptr;
  check_cuda(cudaEventCreate(&reference), "cudaEventCreate (trace reference)");
  trace_reference_ = reference;
  check_cuda(cudaEventRecord(reference, at::cuda::getCurrentCUDAStream(device_.index()).stream()), "cudaEventRecord");
  wait_until([&] { return cudaEventQuery(reference) == cudaSuccess; }, "the trace's reference event", rank_);
  trace_reference_us_ = trace::now_us();
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
  // A transport never connected may still be creating its communicators: those are aborted too.
  bool clean = !aborted_ && connected() && sends_.empty() && exchange_ == nullptr;
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

void NcclTransport::report_failure(const std::string& reason) { report_failure_to_coordinator(rank_, reason); }

std::string NcclTransport::describe(const Channel& channel) {
  if (channel.group) return str("the sequence group (ranks ", rank_list(channel.ranks), ")");
  return str("the link ", channel.outbound ? "to" : "from", " rank ", channel.peer);
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

void NcclTransport::abort_all() noexcept {
  if (aborted_) return;
  aborted_ = true;
  for (auto& channel : channels_)
    if (channel->comm != nullptr) ncclCommAbort(channel->comm);
}

}  // namespace dp::runtime
