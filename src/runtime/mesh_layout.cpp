#include "runtime/mesh_layout.h"

#include "core/error.h"

namespace dp::runtime {

MeshLayout::MeshLayout(std::vector<placement::RankStage> stages, placement::MeshShape shape, int64_t text_tokens,
                       int64_t image_tokens)
    : stages_(std::move(stages)), shape_(shape), text_tokens_(text_tokens), image_tokens_(image_tokens) {
  DP_CHECK(!stages_.empty(), "the device map gives no rank any transformer block");
  DP_CHECK(shape_.stages >= 1 && shape_.sequence_parallel >= 1, "a mesh of ", shape_.stages, " x ",
           shape_.sequence_parallel, " ranks");
  for (const auto& s : stages_)
    DP_CHECK(s.rank >= 0 && s.rank < shape_.stages, "stage group ", s.rank, " holds blocks [", s.first_block, ", ",
             s.last_block, ") but the mesh has ", shape_.stages, " stage group(s)");
  for (size_t i = 1; i < stages_.size(); ++i)
    DP_CHECK(stages_[i].rank != 0, "rank 0 (the coordinator) holds blocks [", stages_[i].first_block, ", ",
             stages_[i].last_block, ") but not the first ones; it can only start the ring: give GPU 0 the first "
             "blocks or none");
  DP_CHECK(text_tokens_ >= shape_.sequence_parallel && image_tokens_ >= shape_.sequence_parallel, "--sequence-parallel ",
           shape_.sequence_parallel, " leaves a rank without tokens (", text_tokens_, " text and ", image_tokens_,
           " image tokens)");
}

const placement::RankStage* MeshLayout::stage_of(int rank) const {
  const int group = group_of(rank);
  for (const auto& s : stages_)
    if (s.rank == group) return &s;
  return nullptr;
}

int MeshLayout::previous(int rank) const {
  const int group = group_of(rank);
  for (size_t i = 0; i < stages_.size(); ++i)
    if (stages_[i].rank == group) return i == 0 ? 0 : shape_.rank_of(stages_[i - 1].rank, shard_of(rank));
  return 0;  // idle ranks hear only from the coordinator
}

int MeshLayout::next(int rank) const {
  const int group = group_of(rank);
  for (size_t i = 0; i < stages_.size(); ++i)
    if (stages_[i].rank == group) return i + 1 == stages_.size() ? 0 : shape_.rank_of(stages_[i + 1].rank, shard_of(rank));
  return 0;
}

std::vector<MeshLayout::Link> MeshLayout::links() const {
  std::vector<Link> links;
  for (const auto& s : stages_)
    for (int rank : shape_.group(s.rank))
      if (previous(rank) != rank) links.push_back({previous(rank), rank});
  for (int rank : last_ranks())
    if (rank != 0) links.push_back({rank, 0});
  return links;
}

std::string MeshLayout::describe() const {
  std::string text;
  for (const auto& s : stages_) {
    std::string stage = placement::describe_stage(s);
    if (sequence_parallel() > 1) {
      // "rank g blocks ..." names the group: say which ranks it is.
      const auto ranks = shape_.group(s.rank);
      stage = str("group ", s.rank, " (ranks ", ranks.front(), "-", ranks.back(), ")",
                  stage.substr(stage.find(' ', stage.find(' ') + 1)));
    }
    text += str(text.empty() ? "" : ", ", stage);
  }
  return text;
}

}  // namespace dp::runtime
