// The mesh of stage groups x sequence-parallel ranks (placement/mesh.h): rank numbering with the sequence
// groups innermost, token shards, and the checks on --sequence-parallel made before anything loads.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "placement/mesh.h"

namespace dp::placement {
namespace {

TEST(Mesh, SequenceGroupsAreNeighbouringRanks) {
  const MeshShape mesh = mesh_for_world(6, 3);
  EXPECT_EQ(mesh.stages, 2);
  EXPECT_EQ(mesh.world_size(), 6);
  EXPECT_EQ(mesh.group(1), (std::vector<int>{3, 4, 5}));
  for (int rank = 0; rank < 6; ++rank) EXPECT_EQ(mesh.rank_of(mesh.stage_of(rank), mesh.shard_of(rank)), rank);
  EXPECT_EQ(mesh.stage_of(4), 1);
  EXPECT_EQ(mesh.shard_of(4), 1);
}

TEST(Mesh, AWorldTheGroupsDoNotDivideIsRefusedNamingTheDivisors) {
  try {
    mesh_for_world(6, 4);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid values: 1, 2, 3, 6"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mesh_for_world(4, 0), Error);
}

TEST(Mesh, TokenShardsCoverTheSequenceInOrderAndDifferByAtMostOne) {
  for (int64_t tokens : {1, 7, 512, 4096, 4097}) {
    for (int k = 1; k <= 5 && k <= tokens; ++k) {
      int64_t next = 0;
      for (int shard = 0; shard < k; ++shard) {
        const TokenRange range = token_shard(tokens, k, shard);
        EXPECT_EQ(range.first, next) << tokens << " tokens, shard " << shard << " of " << k;
        EXPECT_TRUE(range.count == tokens / k || range.count == tokens / k + 1);
        next = range.end();
      }
      EXPECT_EQ(next, tokens);
    }
  }
  EXPECT_EQ(token_shard(512, 3, 0).count, 171);
  EXPECT_EQ(token_shard(512, 3, 2).count, 170);
}

TEST(Mesh, SequenceParallelMustDivideTheHeadsAndLeaveEveryRankTokens) {
  // FLUX.1-dev: 24 heads; a tiny model with 2 heads and a short prompt limits K more.
  const SequenceParallelLimits dev{24, 512, 4096};
  EXPECT_EQ(valid_sequence_parallel(dev, 8), (std::vector<int>{1, 2, 3, 4, 6, 8}));
  EXPECT_NO_THROW(check_sequence_parallel(3, dev, 3));
  try {
    check_sequence_parallel(5, dev, 8);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the world of 8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1, 2, 4, 8 ["), std::string::npos) << e.what();
  }
  // A world of 10: 3, 4, 6 and 8 fit the model but not the world, so they are not offered.
  for (int k : {4, 5}) {
    try {
      check_sequence_parallel(k, dev, 10);
      FAIL() << "expected a refusal of " << k;
    } catch (const Error& e) {
      const std::string text = e.what();
      // The message ends with the valid list, then dp::Error's " [file:line]".
      EXPECT_NE(text.find(": 1, 2 ["), std::string::npos) << text;
      EXPECT_NE(text.find(k == 5 ? "24 attention heads" : "world of 10"), std::string::npos) << text;
    }
  }
  const SequenceParallelLimits few_tokens{4, 2, 64};
  EXPECT_EQ(valid_sequence_parallel(few_tokens, 4), (std::vector<int>{1, 2}));
  EXPECT_THROW(check_sequence_parallel(4, few_tokens, 4), Error);
}

// generate's check: K must divide the world as well, and the refusal names only the values that pass all of it.
TEST(Mesh, GenerateNamesTheValuesThatDivideTheWorldAndTheHeads) {
  const SequenceParallelLimits twelve{12, 32, 24};
  EXPECT_EQ(check_mesh(4, 2, twelve).stages, 2);
  EXPECT_EQ(check_mesh(3, 3, twelve).sequence_parallel, 3);
  const auto refusal = [](int world, int k, const SequenceParallelLimits& limits) {
    try {
      check_mesh(world, k, limits);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // 3 divides the heads but not a world of 4; 5 neither; 8 leaves some rank no image token of 6.
  EXPECT_NE(refusal(4, 3, twelve).find("does not divide the world of 4 rank(s)"), std::string::npos);
  EXPECT_NE(refusal(4, 3, twelve).find("world of 4 rank(s): 1, 2, 4"), std::string::npos) << refusal(4, 3, twelve);
  EXPECT_NE(refusal(6, 6, {2, 32, 24}).find("does not divide the transformer's 2 attention heads"), std::string::npos);
  EXPECT_NE(refusal(6, 6, {2, 32, 24}).find("world of 6 rank(s): 1, 2 "), std::string::npos) << refusal(6, 6, {2, 32, 24});
  EXPECT_NE(refusal(8, 8, {24, 512, 6}).find("leaves a rank without tokens"), std::string::npos);
  EXPECT_EQ(refusal(1, 2, twelve).find("accepted"), std::string::npos);
}

}  // namespace
}  // namespace dp::placement
