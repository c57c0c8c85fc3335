// The mesh layout every phase consults (runtime/mesh_layout.h): who holds which blocks and tokens, who sends to
// whom, and which boundaries carry tensors; with K = 1 exactly the plain ring.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/mesh_layout.h"

namespace dp::runtime {
namespace {

using Links = std::vector<std::pair<int, int>>;

Links links_of(const MeshLayout& layout) {
  Links out;
  for (const auto& l : layout.links()) out.emplace_back(l.from, l.to);
  return out;
}

TEST(MeshLayout, OneRankPerGroupIsThePlainRing) {
  // Blocks [0, 3) on rank 0, [3, 6) on rank 1, [6, 9) on rank 2.
  const MeshLayout ring({{0, 0, 3}, {1, 3, 6}, {2, 6, 9}}, placement::MeshShape{3, 1}, 32, 24);
  EXPECT_TRUE(ring.coordinator_runs_first_stage());
  EXPECT_EQ(ring.previous(1), 0);
  EXPECT_EQ(ring.next(1), 2);
  EXPECT_EQ(ring.next(2), 0);
  EXPECT_EQ(ring.last_ranks(), std::vector<int>{2});
  EXPECT_EQ(links_of(ring), (Links{{0, 1}, {1, 2}, {2, 0}}));
  EXPECT_EQ(ring.describe(), "rank 0 blocks [0, 3), rank 1 blocks [3, 6), rank 2 blocks [6, 9)");
  EXPECT_EQ(ring.text_shard(0).count, 32);
}

TEST(MeshLayout, TwoByTwoChainsEachShardThroughTheGroups) {
  // Group 0 = ranks 0, 1 with blocks [0, 3); group 1 = ranks 2, 3 with [3, 6).
  const MeshLayout mesh({{0, 0, 3}, {1, 3, 6}}, placement::MeshShape{2, 2}, 7, 24);
  EXPECT_EQ(mesh.group_of(3), 1);
  EXPECT_EQ(mesh.shard_of(3), 1);
  EXPECT_EQ(mesh.stage_of(1)->last_block, 3);
  EXPECT_EQ(mesh.group_ranks(2), (std::vector<int>{2, 3}));
  EXPECT_EQ(mesh.first_ranks(), (std::vector<int>{0, 1}));
  EXPECT_EQ(mesh.last_ranks(), (std::vector<int>{2, 3}));
  EXPECT_EQ(mesh.previous(1), 0);  // the first group hears from the coordinator
  EXPECT_EQ(mesh.next(1), 3);      // shard 1 goes on to shard 1 of the next group
  EXPECT_EQ(mesh.previous(3), 1);
  EXPECT_EQ(mesh.next(3), 0);
  EXPECT_EQ(links_of(mesh), (Links{{0, 1}, {0, 2}, {1, 3}, {2, 0}, {3, 0}}));
  EXPECT_EQ(mesh.text_shard(0).count, 4);
  EXPECT_EQ(mesh.text_shard(1).first, 4);
  EXPECT_EQ(mesh.image_shard(1).count, 12);
  EXPECT_EQ(mesh.describe(), "group 0 (ranks 0-1) blocks [0, 3), group 1 (ranks 2-3) blocks [3, 6)");
}

TEST(MeshLayout, AnIdleFirstGroupLeavesTheCoordinatorOnlyScatteringAndGathering) {
  // Every block on group 1 (ranks 2, 3); ranks 0 and 1 hold none.
  const MeshLayout mesh({{1, 0, 6}}, placement::MeshShape{2, 2}, 8, 8);
  EXPECT_FALSE(mesh.coordinator_runs_first_stage());
  EXPECT_EQ(mesh.stage_of(1), nullptr);
  EXPECT_EQ(links_of(mesh), (Links{{0, 2}, {0, 3}, {2, 0}, {3, 0}}));
}

TEST(MeshLayout, RefusesWhatTheRingCannotRun) {
  // Rank 0 holding later blocks only, a group past the mesh, K leaving a rank no token.
  EXPECT_THROW(MeshLayout({{1, 0, 3}, {0, 3, 6}}, placement::MeshShape{2, 2}, 8, 8), Error);
  EXPECT_THROW(MeshLayout({{2, 0, 6}}, placement::MeshShape{2, 2}, 8, 8), Error);
  EXPECT_THROW(MeshLayout({{0, 0, 6}}, placement::MeshShape{1, 4}, 3, 8), Error);
}

}  // namespace
}  // namespace dp::runtime
