#include "runtime/mpi_transport.h"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <limits>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "runtime/failure_channel.h"

namespace dp::runtime {
namespace {

constexpr int kDataTag = 1;
constexpr int64_t kMagic = 0x6470697065727567;  // "dpiperug", arbitrary
constexpr int64_t kVersion = 1;
constexpr int kMaxTensors = 4;
constexpr int kMaxDims = 4;
constexpr int kTensorWords = 3 + kMaxDims;  // defined, dtype, ndim, dims
constexpr int kHeaderWords = 5 + kMaxTensors * kTensorWords;
constexpr int64_t kChunkBytes = int64_t{1} << 30;
constexpr size_t kMaxPendingSends = 16;
// No tensor the ring moves comes near this; a header claiming more is corrupt.
constexpr int64_t kMaxTensorBytes = int64_t{64} << 30;

const char* kind_names[] = {"?",        "prompts",    "step",   "activations", "noise",
                            "release",  "shutdown",   "embeddings", "decode", "images"};
static_assert(sizeof(kind_names) / sizeof(kind_names[0]) == kMessageKinds + 1, "a name for every message kind");

int dtype_code(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return 0;
    case at::kBFloat16: return 1;
    case at::kHalf: return 2;
    case at::kLong: return 3;
    case at::kByte: return 4;
    default: DP_FAIL("the transport does not carry tensors of dtype ", type);
  }
}

at::ScalarType dtype_of(int64_t code, int source) {
  switch (code) {
    case 0: return at::kFloat;
    case 1: return at::kBFloat16;
    case 2: return at::kHalf;
    case 3: return at::kLong;
    case 4: return at::kByte;
    default: DP_FAIL("message from rank ", source, ": unknown dtype code ", code);
  }
}

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

const char* message_kind_name(MessageKind kind) {
  const auto k = static_cast<int>(kind);
  return k >= 1 && k <= kMessageKinds ? kind_names[k] : kind_names[0];
}

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
  DP_CHECK(message.tensors.size() <= kMaxTensors, "a message carries at most ", kMaxTensors, " tensors");
  auto pending = std::make_unique<PendingSend>();
  pending->peer = peer;
  pending->header.assign(kHeaderWords, 0);
  auto& h = pending->header;
  h[0] = kMagic;
  h[1] = (kVersion << 32) | static_cast<int64_t>(message.kind);
  h[2] = message.microbatch;
  h[3] = message.step;
  h[4] = static_cast<int64_t>(message.tensors.size());
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    int64_t* d = &h[5 + i * kTensorWords];
    const at::Tensor& t = message.tensors[i];
    if (!t.defined()) continue;
    DP_CHECK(t.dim() <= kMaxDims, "a message tensor has at most ", kMaxDims, " dimensions, got ", t.dim());
    d[0] = 1;
    d[1] = dtype_code(t.scalar_type());
    d[2] = t.dim();
    for (int64_t k = 0; k < t.dim(); ++k) d[3 + k] = t.size(k);
    pending->staged.push_back(t.to(at::kCPU).contiguous());
  }
  pending->requests.emplace_back();
  check_mpi(MPI_Isend(h.data(), kHeaderWords, MPI_INT64_T, peer, kDataTag, MPI_COMM_WORLD,
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
  std::vector<int64_t> h(kHeaderWords, 0);
  std::vector<MPI_Request> requests(1);
  check_mpi(MPI_Irecv(h.data(), kHeaderWords, MPI_INT64_T, peer, kDataTag, MPI_COMM_WORLD, &requests[0]),
            "MPI_Irecv (header)");
  wait(requests, "message", peer);

  // The header comes from another process: check everything before allocating.
  const auto bad = [&](const auto&... what) { DP_FAIL("rank ", rank_, ": malformed message from rank ", peer, ": ", what...); };
  if (h[0] != kMagic) bad("bad magic (another program on this communicator?)");
  if ((h[1] >> 32) != kVersion) bad("wire version ", h[1] >> 32, ", this build speaks ", kVersion);
  const int64_t kind = h[1] & 0xffffffff;
  if (kind < 1 || kind > kMessageKinds) bad("unknown kind ", kind);
  if (h[4] < 0 || h[4] > kMaxTensors) bad(h[4], " tensors");
  Message message;
  message.source = peer;
  message.kind = static_cast<MessageKind>(kind);
  message.microbatch = h[2];
  if (h[3] < std::numeric_limits<int32_t>::min() || h[3] > std::numeric_limits<int32_t>::max()) bad("step ", h[3]);
  message.step = static_cast<int32_t>(h[3]);
  requests.clear();
  for (int64_t i = 0; i < h[4]; ++i) {
    const int64_t* d = &h[5 + i * kTensorWords];
    if (d[0] == 0) {
      message.tensors.emplace_back();
      continue;
    }
    if (d[0] != 1 || d[2] < 0 || d[2] > kMaxDims) bad("tensor ", i, " descriptor");
    std::vector<int64_t> shape(d + 3, d + 3 + d[2]);
    int64_t numel = 1;
    for (int64_t s : shape) {
      if (s < 0 || (s > 0 && numel > kMaxTensorBytes / s)) bad("tensor ", i, " shape");
      numel *= s;
    }
    const at::ScalarType type = dtype_of(d[1], peer);
    const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(type));
    if (bytes > kMaxTensorBytes) bad("tensor ", i, " of ", bytes, " bytes");
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
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
