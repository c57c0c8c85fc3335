#include "placement/mesh.h"

#include <algorithm>

#include "core/error.h"

namespace dp::placement {
namespace {

std::string join(const std::vector<int>& values) {
  std::string text;
  for (int v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
  return text.empty() ? "none" : text;
}

}  // namespace

std::vector<int> MeshShape::group(int stage) const {
  std::vector<int> ranks;
  for (int k = 0; k < sequence_parallel; ++k) ranks.push_back(rank_of(stage, k));
  return ranks;
}

MeshShape mesh_for_world(int world_size, int sequence_parallel) {
  DP_CHECK(world_size >= 1, "world size must be at least 1, got ", world_size);
  std::vector<int> divisors;
  for (int k = 1; k <= world_size; ++k)
    if (world_size % k == 0) divisors.push_back(k);
  DP_CHECK(sequence_parallel >= 1 && sequence_parallel <= world_size && world_size % sequence_parallel == 0,
           "--sequence-parallel ", sequence_parallel, " does not divide the world of ", world_size,
           " rank(s) into stage groups (world size = stages x sequence-parallel); valid values: ", join(divisors));
  return MeshShape{world_size / sequence_parallel, sequence_parallel};
}

TokenRange token_shard(int64_t tokens, int sequence_parallel, int shard) {
  DP_CHECK(sequence_parallel >= 1 && shard >= 0 && shard < sequence_parallel, "token shard ", shard, " of ",
           sequence_parallel, " does not exist");
  const int64_t base = tokens / sequence_parallel;
  const int64_t longer = tokens % sequence_parallel;
  const int64_t first = shard * base + std::min<int64_t>(shard, longer);
  return TokenRange{first, base + (shard < longer ? 1 : 0)};
}

std::vector<int> valid_sequence_parallel(const SequenceParallelLimits& limits, int max_k) {
  std::vector<int> valid;
  for (int k = 1; k <= max_k; ++k) {
    if (limits.attention_heads % k != 0) continue;
    if (limits.text_tokens < k || limits.image_tokens < k) continue;
    valid.push_back(k);
  }
  return valid;
}

void check_sequence_parallel(int sequence_parallel, const SequenceParallelLimits& limits, int world_size) {
  (void)check_mesh(world_size, sequence_parallel, limits);
}

MeshShape check_mesh(int world_size, int sequence_parallel, const SequenceParallelLimits& limits) {
  DP_CHECK(world_size >= 1, "world size must be at least 1, got ", world_size);
  std::vector<int> valid;
  for (int k : valid_sequence_parallel(limits, world_size))
    if (world_size % k == 0) valid.push_back(k);
  const std::string valid_text = str("valid values for this model and request in a world of ", world_size,
                                     " rank(s): ", join(valid));
  const int k = sequence_parallel;
  DP_CHECK(k >= 1 && k <= world_size && world_size % k == 0, "--sequence-parallel ", k, " does not divide the world of ",
           world_size, " rank(s) into stage groups (world size = stages x sequence-parallel); ", valid_text);
  DP_CHECK(limits.attention_heads % k == 0, "--sequence-parallel ", k, " does not divide the transformer's ",
           limits.attention_heads, " attention heads (each rank computes whole heads); ", valid_text);
  DP_CHECK(limits.text_tokens >= k && limits.image_tokens >= k, "--sequence-parallel ", k,
           " leaves a rank without tokens (", limits.text_tokens, " text and ", limits.image_tokens,
           " image tokens); ", valid_text);
  return MeshShape{world_size / k, k};
}

}  // namespace dp::placement
