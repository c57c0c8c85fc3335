#include "runtime/mpi_transport.h"

#include <algorithm>
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

MpiTransport::MpiTransport(int rank, int world_size, double timeout_seconds)
    : rank_(rank), world_size_(world_size), timeout_seconds_(timeout_seconds) {
  DP_CHECK(timeout_seconds > 0, "--transport-timeout must be positive, got ", timeout_seconds);
}

MpiTransport::~MpiTransport() {
  // Undelivered sends at destruction mean the run is failing; their requests die with MPI_Abort/Finalize.
  for (auto& p : pending_)
    for (auto& r : p->requests)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
}

void MpiTransport::send(int peer, Message message) {
  DP_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "rank ", rank_, ": cannot send to rank ", peer);
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
    DP_CHECK(waited < timeout_seconds_, "rank ", rank_, ": no ", what, " from rank ", peer, " within ", std::fixed,
             std::setprecision(0), timeout_seconds_, " s (--transport-timeout): rank ", peer,
             " is stuck, dead or unreachable");
    // Back off to a millisecond: ranks oversubscribed on few cores must not starve each other by spinning.
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

void MpiTransport::report_failure(const std::string& reason) { report_failure_to_coordinator(rank_, reason); }

}  // namespace dp::runtime
