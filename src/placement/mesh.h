#pragma once
// The mesh of a run: S pipeline stages x K sequence-parallel ranks (world size = S x K). The ranks of one stage
// group hold the same blocks and split the tokens between them (Ulysses: an all-to-all around attention turns
// "my tokens, all heads" into "all tokens, my heads"). Sequence groups are the innermost dimension, as in
// Megatron/xDiT: rank = stage x K + k, so the group that exchanges the most bytes sits on neighbouring ranks
// (one node's NVLink), while pipeline neighbours may cross nodes. Torch-free: `plan` and `generate` both use it.
#include <cstdint>
#include <string>
#include <vector>

namespace dp::placement {

// A contiguous run of tokens [first, first + count).
struct TokenRange {
  int64_t first = 0;
  int64_t count = 0;
  int64_t end() const { return first + count; }
};

struct MeshShape {
  int stages = 1;             // S
  int sequence_parallel = 1;  // K
  int world_size() const { return stages * sequence_parallel; }

  int stage_of(int rank) const { return rank / sequence_parallel; }
  int shard_of(int rank) const { return rank % sequence_parallel; }
  int rank_of(int stage, int shard) const { return stage * sequence_parallel + shard; }
  // The ranks of `stage`'s group, shard 0 first.
  std::vector<int> group(int stage) const;
};

// The mesh for `world_size` ranks and --sequence-parallel k: k must divide the world. Throws naming the
// divisors otherwise.
MeshShape mesh_for_world(int world_size, int sequence_parallel);

// Shard `shard` of `tokens` split over k ranks: contiguous, the first (tokens % k) shards one token longer, so
// any split differs by at most one token and shard order is sequence order.
TokenRange token_shard(int64_t tokens, int sequence_parallel, int shard);

// What K must satisfy for a model and a request: it divides the attention heads (each rank computes whole
// heads over the whole sequence), and every rank keeps at least one text and one image token.
struct SequenceParallelLimits {
  int64_t attention_heads = 0;
  int64_t text_tokens = 0;   // max_sequence_length
  int64_t image_tokens = 0;  // packed latent tokens, (height / 16) x (width / 16) for FLUX
};
// The values of K in [1, max_k] that satisfy `limits`, ascending.
std::vector<int> valid_sequence_parallel(const SequenceParallelLimits& limits, int max_k);
// Throws, before anything loads, when K does not divide the world or does not satisfy `limits`, naming the valid
// values for this world (those that also divide world_size).
void check_sequence_parallel(int sequence_parallel, const SequenceParallelLimits& limits, int world_size);
// What `generate` checks before anything loads: K divides the world and satisfies `limits`. Returns the mesh;
// throws naming what K fails and the values that would pass all of it (the divisors of the world that divide
// the heads and leave every rank tokens).
MeshShape check_mesh(int world_size, int sequence_parallel, const SequenceParallelLimits& limits);

}  // namespace dp::placement
