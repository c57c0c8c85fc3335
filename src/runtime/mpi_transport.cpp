#include "runtime/mpi_transport.h"

#include <algorithm>
#include <cstring>
#include <chrono>
#include <iomanip>
#include <limits>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "runtime/failure_channel.h"
#include "runtime/wire_header.h"

namespace dp::runtime {
namespace {

constexpr int kDataTag = 1;
constexpr int64_t kChunkBytes = int64_t{1} << 30;
constexpr size_t kMaxPendingSends = 16;

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  DP_FAIL(what, " failed: ", std::string(text, static_cast<size_t>(length)));
}

// Posts the sends or receives of `bytes` at `data` in pieces of at most kChunkBytes.
template <typename Post>
void post_chunks(char* data, int64_t bytes, Post&& post) {
  for (int64_t offset = 0; offset < bytes; offset += kChunkBytes) {
    post(data + offset, static_cast<int>(std::min(kChunkBytes, bytes - offset)));
  }
}

}  // namespace

MpiTransport::MpiTransport(int rank, int world_size, double timeout_seconds, std::vector<int> group)
    : rank_(rank), world_size_(world_size), timeout_seconds_(timeout_seconds), group_(std::move(group)) {
  DP_CHECK(timeout_seconds > 0, "--transport-timeout must be positive, got ", timeout_seconds);
  if (group_.size() <= 1) return;
  const auto me = std::find(group_.begin(), group_.end(), rank_);
  DP_CHECK(me != group_.end(), "rank ", rank_, " is not in its own sequence group");
  group_index_ = static_cast<int>(me - group_.begin());
  // MPI has no non-blocking communicator split. Every rank has just passed the agreements' bounded collectives,
  // so all are alive and here; the key orders the group's ranks by shard.
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, group_.front(), group_index_, &group_comm_), "MPI_Comm_split (sequence group)");
  MPI_Comm_set_errhandler(group_comm_, MPI_ERRORS_RETURN);
  int size = 0, index = -1;
  MPI_Comm_size(group_comm_, &size);
  MPI_Comm_rank(group_comm_, &index);
  DP_CHECK(size == static_cast<int>(group_.size()) && index == group_index_, "rank ", rank_, ": the sequence group's "
           "communicator has ", size, " ranks (this one ", index, "), expected ", group_.size(), " (", group_index_, ")");
}

MpiTransport::~MpiTransport() {
  if (group_comm_ != MPI_COMM_NULL) MPI_Comm_free(&group_comm_);
  // Undelivered sends at destruction mean the run is failing; their requests die with MPI_Abort/Finalize.
  for (auto& p : pending_)
    for (auto& r : p->requests)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
}

void MpiTransport::send(int peer, Message message) {
  DP_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": cannot send to rank ", peer);
  check_connected(rank_, "send");
  auto pending = std::make_unique<PendingSend>();
  pending->peer = peer;
  pending->header = wire::encode(message, rank_);
  for (const auto& t : message.tensors)
    if (t.defined()) pending->staged.push_back(t.to(at::kCPU).contiguous());
  const auto& h = pending->header;
  pending->requests.emplace_back();
  check_mpi(MPI_Isend(h.data(), wire::kHeaderWords, MPI_INT64_T, peer, kDataTag, MPI_COMM_WORLD,
                      &pending->requests.back()),
            "MPI_Isend (header)");
  for (auto& t : pending->staged) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    bytes_sent_ += static_cast<uint64_t>(bytes);
    post_chunks(static_cast<char*>(t.data_ptr()), bytes, [&](char* data, int count) {
      pending->requests.emplace_back();
      check_mpi(MPI_Isend(data, count, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD, &pending->requests.back()),
                "MPI_Isend (tensor)");
    });
  }
  pending_.push_back(std::move(pending));
  progress_sends();
  while (pending_.size() > kMaxPendingSends) wait_oldest_send();
}

Message MpiTransport::receive(int peer) {
  DP_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": cannot receive from rank ", peer);
  check_connected(rank_, "receive");
  std::vector<int64_t> words(wire::kHeaderWords, 0);
  std::vector<MPI_Request> requests(1);
  check_mpi(MPI_Irecv(words.data(), wire::kHeaderWords, MPI_INT64_T, peer, kDataTag, MPI_COMM_WORLD, &requests[0]),
            "MPI_Irecv (header)");
  wait(requests, "message", peer);
  const wire::Header header = wire::decode(words, rank_, peer);  // checked before anything is allocated
  Message message{header.kind, header.microbatch, header.step, {}, peer};
  requests.clear();
  for (const auto& spec : header.tensors) {
    if (!spec.defined) {
      message.tensors.emplace_back();
      continue;
    }
    at::Tensor t = at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype));
    const int64_t bytes = spec.bytes();
    post_chunks(static_cast<char*>(t.data_ptr()), bytes, [&](char* data, int count) {
      requests.emplace_back();
      check_mpi(MPI_Irecv(data, count, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD, &requests.back()),
                "MPI_Irecv (tensor)");
    });
    bytes_received_ += static_cast<uint64_t>(bytes);
    message.tensors.push_back(std::move(t));
  }
  wait(requests, str(message_kind_name(message.kind), " tensors"), peer);
  return message;
}

bool MpiTransport::has_message(int peer) {
  DP_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": cannot receive from rank ", peer);
  check_connected(rank_, "has_message");
  int arrived = 0;
  check_mpi(MPI_Iprobe(peer, kDataTag, MPI_COMM_WORLD, &arrived, MPI_STATUS_IGNORE), "MPI_Iprobe");
  return arrived != 0;
}

Message MpiTransport::receive_any(const std::vector<int>& peers) {
  DP_CHECK(!peers.empty(), "rank ", rank_, ": receive from no rank");
  if (peers.size() == 1) return receive(peers.front());
  using clock = std::chrono::steady_clock;
  const auto started = clock::now();
  auto pause = std::chrono::microseconds(10);
  // Probe rather than post a receive from any source: a header is only taken from a peer once it is there, so
  // each peer's messages stay in order and a message from a rank not in `peers` is never consumed here.
  for (size_t turn = 0;; ++turn) {
    for (size_t i = 0; i < peers.size(); ++i) {
      const int peer = peers[(turn + i) % peers.size()];  // rotate, so that a busy peer cannot starve another
      if (has_message(peer)) return receive(peer);
    }
    progress_sends();
    throw_if_a_rank_failed(rank_);
    const double waited = std::chrono::duration<double>(clock::now() - started).count();
    if (waited >= timeout_seconds_) {
      std::string names;
      for (int p : peers) names += (names.empty() ? "" : " or ") + std::to_string(p);
      DP_FAIL("rank ", rank_, ": no message from rank ", names, " within ", std::fixed, std::setprecision(0),
              timeout_seconds_, " s (--transport-timeout): a rank is stuck, dead or unreachable");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

void MpiTransport::flush() {
  while (!pending_.empty()) wait_oldest_send();
}

void MpiTransport::wait_oldest_send() {
  // Taken out of the queue first: wait() moves the queue along and would free it under our feet.
  std::unique_ptr<PendingSend> oldest = std::move(pending_.front());
  pending_.pop_front();
  wait(oldest->requests, "delivery of a message", oldest->peer);
}

void MpiTransport::progress_sends() {
  while (!pending_.empty()) {
    auto& oldest = *pending_.front();
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(oldest.requests.size()), oldest.requests.data(), &done,
                          MPI_STATUSES_IGNORE),
              "MPI_Testall (sends)");
    if (!done) return;
    pending_.pop_front();
  }
}

void MpiTransport::wait(std::vector<MPI_Request>& requests, const std::string& what, int peer) {
  using clock = std::chrono::steady_clock;
  const auto started = clock::now();
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (done) return;
    progress_sends();
    throw_if_a_rank_failed(rank_);
    const double waited = std::chrono::duration<double>(clock::now() - started).count();
    DP_CHECK(waited < timeout_seconds_, "rank ", rank_, ": no ", what, peer >= 0 ? str(" from rank ", peer) : "",
             " within ", std::fixed, std::setprecision(0), timeout_seconds_, " s (--transport-timeout): ",
             peer >= 0 ? str("rank ", peer) : std::string("a rank of the group"), " is stuck, dead or unreachable");
    // Back off to a millisecond: ranks oversubscribed on few cores must not starve each other by spinning.
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

void MpiTransport::report_failure(const std::string& reason) { report_failure_to_coordinator(rank_, reason); }

void MpiTransport::all_to_all(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv, int step) {
  check_connected(rank_, "all_to_all");
  const auto members = group_.size();
  DP_CHECK(group_comm_ != MPI_COMM_NULL && send.size() == members && recv.size() == members, "rank ", rank_,
           ": an all-to-all of ", send.size(), " parts in a sequence group of ", members, " rank(s)");
  const auto started = std::chrono::steady_clock::now();
  const auto bytes_of = [](const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); };
  // MPI_Ialltoallv takes one buffer with offsets each way, in bytes that must fit an int; this rank's own part
  // is copied directly.
  std::vector<int> send_counts(members, 0), send_offsets(members, 0), recv_counts(members, 0), recv_offsets(members, 0);
  int64_t send_total = 0, recv_total = 0;
  for (size_t j = 0; j < members; ++j) {
    DP_CHECK(send[j].is_contiguous() && recv[j].is_contiguous() && send[j].scalar_type() == recv[j].scalar_type(),
             "rank ", rank_, ": all-to-all parts must be contiguous and of one dtype");
    if (static_cast<int>(j) == group_index_) continue;
    send_offsets[j] = static_cast<int>(send_total);
    recv_offsets[j] = static_cast<int>(recv_total);
    send_counts[j] = static_cast<int>(bytes_of(send[j]));
    recv_counts[j] = static_cast<int>(bytes_of(recv[j]));
    send_total += bytes_of(send[j]);
    recv_total += bytes_of(recv[j]);
    DP_CHECK(send_total <= std::numeric_limits<int>::max() && recv_total <= std::numeric_limits<int>::max(), "rank ",
             rank_, ": an all-to-all of ", std::max(send_total, recv_total), " bytes exceeds MPI's int counts; use "
             "--transport nccl or a smaller --microbatch-size");
  }
  at::Tensor outgoing = at::empty({send_total}, at::TensorOptions().dtype(at::kByte));
  at::Tensor incoming = at::empty({recv_total}, at::TensorOptions().dtype(at::kByte));
  for (size_t j = 0; j < members; ++j) {
    if (static_cast<int>(j) == group_index_) continue;
    const at::Tensor host = send[j].to(at::kCPU).contiguous();
    std::memcpy(static_cast<char*>(outgoing.data_ptr()) + send_offsets[j], host.data_ptr(), static_cast<size_t>(send_counts[j]));
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ialltoallv(outgoing.data_ptr(), send_counts.data(), send_offsets.data(), MPI_BYTE, incoming.data_ptr(),
                           recv_counts.data(), recv_offsets.data(), MPI_BYTE, group_comm_, &request),
            "MPI_Ialltoallv (sequence group)");
  recv[static_cast<size_t>(group_index_)].copy_(send[static_cast<size_t>(group_index_)]);
  std::string peers;
  for (int r : group_) peers += (peers.empty() ? "" : ", ") + std::to_string(r);
  std::vector<MPI_Request> requests = {request};
  wait(requests, str("all-to-all of the sequence group (ranks ", peers, ")"), -1);
  for (size_t j = 0; j < members; ++j) {
    if (static_cast<int>(j) == group_index_) continue;
    const at::Tensor arrived = at::from_blob(static_cast<char*>(incoming.data_ptr()) + recv_offsets[j], recv[j].sizes(),
                                             at::TensorOptions().dtype(recv[j].scalar_type()));
    recv[j].copy_(arrived);
  }
  exchange_bytes_sent_ += static_cast<uint64_t>(send_total);
  exchange_bytes_received_ += static_cast<uint64_t>(recv_total);
  exchange_spans_.push_back({step, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()});
}

std::vector<ExchangeSpan> MpiTransport::take_exchange_spans() {
  std::vector<ExchangeSpan> out;
  out.swap(exchange_spans_);
  return out;
}

}  // namespace dp::runtime
