#include "runtime/wire_header.h"

#include <limits>

#include "core/error.h"

namespace dp::runtime {
namespace {

const char* kind_names[] = {"?",        "prompts",    "step",   "activations", "noise",
                            "release",  "shutdown",   "embeddings", "decode", "images"};
static_assert(sizeof(kind_names) / sizeof(kind_names[0]) == kMessageKinds + 1, "a name for every message kind");

int dtype_code(at::ScalarType type, int rank) {
  switch (type) {
    case at::kFloat: return 0;
    case at::kBFloat16: return 1;
    case at::kHalf: return 2;
    case at::kLong: return 3;
    case at::kByte: return 4;
    default: DP_FAIL("rank ", rank, ": the transport does not carry tensors of dtype ", type);
  }
}

bool dtype_of(int64_t code, at::ScalarType& type) {
  switch (code) {
    case 0: type = at::kFloat; return true;
    case 1: type = at::kBFloat16; return true;
    case 2: type = at::kHalf; return true;
    case 3: type = at::kLong; return true;
    case 4: type = at::kByte; return true;
    default: return false;
  }
}

}  // namespace

const char* message_kind_name(MessageKind kind) {
  const auto k = static_cast<int>(kind);
  return k >= 1 && k <= kMessageKinds ? kind_names[k] : kind_names[0];
}

namespace wire {

int64_t TensorSpec::bytes() const {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return numel * static_cast<int64_t>(c10::elementSize(dtype));
}

std::vector<int64_t> encode(const Message& message, int rank) {
  DP_CHECK(message.tensors.size() <= kMaxTensors, "rank ", rank, ": a message carries at most ", kMaxTensors,
           " tensors, this ", message_kind_name(message.kind), " message has ", message.tensors.size());
  std::vector<int64_t> h(kHeaderWords, 0);
  h[0] = kMagic;
  h[1] = (kVersion << 32) | static_cast<int64_t>(message.kind);
  h[2] = message.microbatch;
  h[3] = message.step;
  h[4] = static_cast<int64_t>(message.tensors.size());
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    int64_t* d = &h[5 + i * kTensorWords];
    const at::Tensor& t = message.tensors[i];
    if (!t.defined()) continue;
    DP_CHECK(t.dim() <= kMaxDims, "rank ", rank, ": a message tensor has at most ", kMaxDims,
             " dimensions, tensor ", i, " of a ", message_kind_name(message.kind), " message has ", t.dim());
    d[0] = 1;
    d[1] = dtype_code(t.scalar_type(), rank);
    d[2] = t.dim();
    for (int64_t k = 0; k < t.dim(); ++k) d[3 + k] = t.size(k);
  }
  return h;
}

Header decode(const std::vector<int64_t>& h, int rank, int peer) {
  const auto bad = [&](const auto&... what) {
    DP_FAIL("rank ", rank, ": malformed message from rank ", peer, ": ", what...);
  };
  if (h.size() != static_cast<size_t>(kHeaderWords)) bad(h.size(), " header words, expected ", kHeaderWords);
  if (h[0] != kMagic) bad("bad magic (another program on this communicator?)");
  if ((h[1] >> 32) != kVersion) bad("wire version ", h[1] >> 32, ", this build speaks ", kVersion);
  const int64_t kind = h[1] & 0xffffffff;
  if (kind < 1 || kind > kMessageKinds) bad("unknown kind ", kind);
  if (h[4] < 0 || h[4] > kMaxTensors) bad(h[4], " tensors");
  if (h[3] < std::numeric_limits<int32_t>::min() || h[3] > std::numeric_limits<int32_t>::max()) bad("step ", h[3]);
  Header header;
  header.kind = static_cast<MessageKind>(kind);
  header.microbatch = h[2];
  header.step = static_cast<int32_t>(h[3]);
  for (int64_t i = 0; i < h[4]; ++i) {
    const int64_t* d = &h[5 + i * kTensorWords];
    TensorSpec spec;
    if (d[0] == 0) {
      header.tensors.push_back(spec);
      continue;
    }
    if (d[0] != 1 || d[2] < 0 || d[2] > kMaxDims) bad("tensor ", i, " descriptor");
    if (!dtype_of(d[1], spec.dtype)) bad("tensor ", i, ": unknown dtype code ", d[1]);
    spec.defined = true;
    spec.shape.assign(d + 3, d + 3 + d[2]);
    // Bytes, not elements, bound the product as it grows, so the multiplication below cannot overflow.
    const int64_t element = static_cast<int64_t>(c10::elementSize(spec.dtype));
    int64_t bytes = element;
    for (int64_t s : spec.shape) {
      if (s < 0 || (s > 0 && bytes > kMaxTensorBytes / s)) bad("tensor ", i, " shape");
      bytes *= s;
    }
    if (bytes > kMaxTensorBytes) bad("tensor ", i, " of ", bytes, " bytes");
    header.tensors.push_back(std::move(spec));
  }
  return header;
}

}  // namespace wire
}  // namespace dp::runtime
