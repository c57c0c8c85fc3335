#pragma once
// Ulysses sequence parallelism for the FLUX blocks. The K members of a sequence group each hold a shard of the
// text tokens and a shard of the image tokens, "my tokens, all heads". Around attention two all-to-alls switch
// to "all tokens, my heads" and back, so every head attends over the whole sequence exactly as on one device;
// everything else in a block works per token. The model knows nothing of how the members talk: the caller
// provides a SequenceExchange (the runtime's over MPI or NCCL, an in-process one in tests).
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "models/flux/flux_layers.h"

namespace dp::models::flux {

// How the members of a sequence group exchange tensors.
class SequenceExchange {
 public:
  virtual ~SequenceExchange() = default;
  // Collective: every member calls it, in the same order. send[j] goes to member j and recv[j] is filled with
  // what member j sent to this one (slot `index` is this member's own). All tensors are contiguous, of one dtype,
  // on this member's device; both sides know every shape beforehand.
  virtual void all_to_all(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv) = 0;
};

// This member's place in its group: the token counts of every member, in member order. Member j holds text
// tokens [sum of text_counts before j, + text_counts[j]) and the image tokens likewise; its local sequence is
// its text tokens followed by its image tokens, as the unsharded sequence is all text then all image.
struct SequenceShard {
  int index = 0;
  std::vector<int64_t> text_counts;
  std::vector<int64_t> image_counts;
  SequenceExchange* exchange = nullptr;  // required when there are several members

  int size() const { return static_cast<int>(text_counts.size()); }
  int64_t text_first(int member) const;
  int64_t image_first(int member) const;
  int64_t text_tokens() const;   // the whole sequence's
  int64_t image_tokens() const;
  int64_t local_tokens(int member) const { return text_counts[static_cast<size_t>(member)] + image_counts[static_cast<size_t>(member)]; }
  // Throws unless the counts describe a group this member belongs to, with an exchange when it has company.
  void check() const;
};

// Rows of `whole` (the tables of the unsharded [text, image] sequence) for this member's local sequence.
RotaryTables shard_rotary(const RotaryTables& whole, const SequenceShard& shard);

// Attention of this member's tokens over the whole sequence. q, k, v: (B, local tokens, H, D) for all H heads,
// rotated; H must be a multiple of the group's size. Returns (B, local tokens, H * D) as attention() would for
// these rows of the unsharded sequence: member j computes heads [j H / K, (j + 1) H / K) over every token.
at::Tensor sequence_parallel_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const SequenceShard& shard);

// attention(), or its sequence-parallel form when `shard` has several members.
at::Tensor group_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const SequenceShard* shard);

}  // namespace dp::models::flux
