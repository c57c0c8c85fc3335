#pragma once
// The fixed-size header that precedes every ring message on the wire, shared by the transports: the MPI
// transport sends the tensors after it over MPI, the NCCL transport over NCCL. The header always travels over
// MPI. It comes from another process, so decoding checks everything (magic, version, kind, tensor count,
// dtypes, ranks of shapes, sizes) before anything is allocated from it.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "runtime/transport.h"

namespace dp::runtime::wire {

constexpr int64_t kMagic = 0x6470697065727567;  // "dpiperug", arbitrary
constexpr int64_t kVersion = 1;
constexpr int kMaxTensors = 4;
constexpr int kMaxDims = 4;
constexpr int kTensorWords = 3 + kMaxDims;  // defined, dtype, ndim, dims
constexpr int kHeaderWords = 5 + kMaxTensors * kTensorWords;
// No tensor the ring moves comes near this; a header claiming more is corrupt.
constexpr int64_t kMaxTensorBytes = int64_t{64} << 30;

// A tensor slot of a message: undefined, or a dtype and a shape.
struct TensorSpec {
  bool defined = false;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t bytes() const;
};

struct Header {
  MessageKind kind = MessageKind::shutdown;
  int64_t microbatch = -1;
  int32_t step = -1;
  std::vector<TensorSpec> tensors;
};

// The words to send for `message`; throws for a message the wire cannot carry (too many tensors or
// dimensions, an unsupported dtype), naming `rank`.
std::vector<int64_t> encode(const Message& message, int rank);
// The header in `words` (kHeaderWords of them) received by `rank` from `peer`; throws "malformed message"
// naming both ranks and what is wrong.
Header decode(const std::vector<int64_t>& words, int rank, int peer);

}  // namespace dp::runtime::wire
