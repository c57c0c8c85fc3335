#pragma once
// Who does what in a run: the mesh of S stage groups x K sequence-parallel ranks (placement/mesh.h, rank =
// group x K + k), the transformer's blocks per group (GPU d of a device map is stage group d), and which
// tokens each rank of a group holds. Every phase asks this object instead of computing ranks itself.
//
// The ring, for each shard k: coordinator (rank 0) -> (first group, k) -> ... -> (last group, k) -> coordinator.
// The K chains run in lockstep: the ranks of a group meet in an all-to-all around every attention. The
// coordinator scatters each step's latents by image tokens (prompt embeddings by text tokens) to the first
// group and gathers the noise prediction's token shards from the last; rank 0 may run shard 0 of the first
// group itself. Groups without blocks idle until the shutdown. With K = 1 this is the plain ring, rank = group.
#include <string>
#include <vector>

#include "placement/mesh.h"
#include "placement/ring_stages.h"

namespace dp::runtime {

class MeshLayout {
 public:
  // `stages`: the plan's ring over stage groups (RankStage::rank is the group index), in block order.
  // `text_tokens` and `image_tokens`: the whole sequence's, split over each group's K ranks. Throws when rank 0
  // holds blocks but not the first ones (the coordinator can only start the ring).
  MeshLayout(std::vector<placement::RankStage> stages, placement::MeshShape shape, int64_t text_tokens,
             int64_t image_tokens);

  const placement::MeshShape& shape() const { return shape_; }
  int world_size() const { return shape_.world_size(); }
  int sequence_parallel() const { return shape_.sequence_parallel; }
  // The ring's stages over groups, in block order (RankStage::rank is a group).
  const std::vector<placement::RankStage>& stages() const { return stages_; }
  int group_of(int rank) const { return shape_.stage_of(rank); }
  int shard_of(int rank) const { return shape_.shard_of(rank); }
  // The blocks `rank`'s group runs, or null for a rank without blocks.
  const placement::RankStage* stage_of(int rank) const;
  // The ranks of `rank`'s group, shard 0 first: its all-to-all peers (itself included).
  std::vector<int> group_ranks(int rank) const { return shape_.group(group_of(rank)); }

  bool coordinator_runs_first_stage() const { return stages_.front().rank == 0; }
  // The ranks of the first and of the last stage group, shard 0 first.
  std::vector<int> first_ranks() const { return shape_.group(stages_.front().rank); }
  std::vector<int> last_ranks() const { return shape_.group(stages_.back().rank); }
  int first_rank() const { return first_ranks().front(); }
  int last_rank() const { return last_ranks().front(); }
  // The rank a stage rank receives from (0 for the first group) and sends to (0 after the last group): its own
  // shard's neighbours. Ranks without blocks hear only from the coordinator.
  int previous(int rank) const;
  int next(int rank) const;
  // The directed boundaries that carry tensors, in the same order on every rank: coordinator -> first group,
  // group -> next group, last group -> coordinator (a boundary from rank 0 to itself left out).
  struct Link {
    int from = 0, to = 0;
  };
  std::vector<Link> links() const;

  // The tokens shard k of a group holds, of the text and of the image sequence.
  placement::TokenRange text_shard(int k) const { return placement::token_shard(text_tokens_, sequence_parallel(), k); }
  placement::TokenRange image_shard(int k) const { return placement::token_shard(image_tokens_, sequence_parallel(), k); }
  int64_t text_tokens() const { return text_tokens_; }
  int64_t image_tokens() const { return image_tokens_; }

  // "rank 0 blocks [0, 3), rank 1 blocks [3, 6)" (K = 1), or by group with its ranks.
  std::string describe() const;

 private:
  std::vector<placement::RankStage> stages_;
  placement::MeshShape shape_;
  int64_t text_tokens_, image_tokens_;
};

}  // namespace dp::runtime
