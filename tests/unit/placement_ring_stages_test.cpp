// The ring a device map gives the multi-rank runtime (placement/ring_stages.h), with offloaded blocks: each
// "cpu"/"disk" block runs on the GPU rank whose range it continues, and offloaded blocks before the first GPU
// block run on that block's rank. FLUX.1-dev numbering: double blocks 0-18, single blocks 19-56.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "models/flux/flux_config.h"
#include "placement/ring_simulator.h"
#include "placement/ring_stages.h"

namespace dp::placement {
namespace {

using Map = nlohmann::ordered_json;

const models::FluxConfig& dev() {
  static const models::FluxConfig config = models::FluxConfig::flux_dev();
  return config;
}

std::string single(int i) { return "single_transformer_blocks." + std::to_string(i); }

// What accelerate's "auto" gives with small GPUs: GPU 0, then GPU 1, then cpu, then disk.
Map auto_like_map() {
  Map map = {{"x_embedder", 0}, {"context_embedder", 0}, {"time_text_embed", 0}, {"transformer_blocks", 0}};
  for (int i = 0; i < 38; ++i) map[single(i)] = i < 10 ? Map(1) : i < 28 ? Map("cpu") : Map("disk");
  map["norm_out"] = "disk";
  map["proj_out"] = "disk";
  return map;
}

TEST(RingStages, AutoOffloadContinuesTheLastGpuRank) {
  const auto stages = ring_stages(auto_like_map(), dev(), 2);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].rank, 0);
  EXPECT_EQ(stages[0].first_block, 0);
  EXPECT_EQ(stages[0].last_block, 19);
  EXPECT_TRUE(stages[0].offloaded.empty());
  EXPECT_EQ(stages[1].rank, 1);
  EXPECT_EQ(stages[1].first_block, 19);
  EXPECT_EQ(stages[1].last_block, 57) << "every block runs: none is dropped";
  ASSERT_EQ(stages[1].offloaded.size(), 28u);
  EXPECT_EQ(stages[1].offloaded.front(), (OffloadedBlock{29, OffloadTier::cpu}));
  EXPECT_EQ(stages[1].offloaded[17], (OffloadedBlock{46, OffloadTier::cpu}));
  EXPECT_EQ(stages[1].offloaded[18], (OffloadedBlock{47, OffloadTier::disk}));
  EXPECT_EQ(stages[1].offloaded.back(), (OffloadedBlock{56, OffloadTier::disk}));
  EXPECT_EQ(describe_stage(stages[1]), "rank 1 blocks [19, 57), 28 offloaded (29-46 cpu, 47-56 disk)");
  EXPECT_EQ(describe_stage(stages[0]), "rank 0 blocks [0, 19)");
}

TEST(RingStages, OffloadedBlocksBetweenRanksJoinTheRankBefore) {
  Map map;
  for (int i = 0; i < 19; ++i) map["transformer_blocks." + std::to_string(i)] = i < 10 ? Map(0) : i < 12 ? Map("cpu") : Map(1);
  map["single_transformer_blocks"] = 2;
  const auto stages = ring_stages(map, dev(), 3);
  ASSERT_EQ(stages.size(), 3u);
  EXPECT_EQ(stages[0].last_block, 12);
  EXPECT_EQ(stages[0].offloaded, (std::vector<OffloadedBlock>{{10, OffloadTier::cpu}, {11, OffloadTier::cpu}}));
  EXPECT_EQ(stages[1].first_block, 12);
  EXPECT_EQ(stages[1].last_block, 19);
  EXPECT_EQ(stages[2].first_block, 19);
}

TEST(RingStages, LeadingOffloadedBlocksJoinTheFirstGpuRank) {
  const Map map = {{"transformer_blocks.0", "disk"}, {"transformer_blocks.1", "cpu"}, {"transformer_blocks", 0},
                   {"single_transformer_blocks", 1}};
  const auto stages = ring_stages(map, dev(), 2);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].rank, 0);
  EXPECT_EQ(stages[0].first_block, 0);
  EXPECT_EQ(stages[0].last_block, 19);
  EXPECT_EQ(stages[0].offloaded, (std::vector<OffloadedBlock>{{0, OffloadTier::disk}, {1, OffloadTier::cpu}}));
  EXPECT_EQ(describe_stage(stages[0]), "rank 0 blocks [0, 19), 2 offloaded (0 disk, 1 cpu)");
}

TEST(RingStages, AnOffloadedBlockInsideOneRankKeepsItContiguous) {
  Map map = {{"transformer_blocks", 0}, {"transformer_blocks.5", "cpu"}, {"single_transformer_blocks", 0}};
  const auto stages = ring_stages(map, dev(), 1);
  ASSERT_EQ(stages.size(), 1u);
  EXPECT_EQ(stages[0].last_block, 57);
  EXPECT_EQ(stages[0].offloaded, (std::vector<OffloadedBlock>{{5, OffloadTier::cpu}}));
}

TEST(RingStages, RefusedMapsSayWhy) {
  // Rank 0 would run blocks on both sides of rank 1's range: the ring would visit it twice.
  const Map twice = {{"transformer_blocks", 0}, {"single_transformer_blocks.0", 1},
                     {"single_transformer_blocks", "cpu"}, {"single_transformer_blocks.37", 0}};
  try {
    ring_stages(twice, dev(), 2);
    FAIL() << "a rank visited twice was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not contiguous"), std::string::npos) << e.what();
  }
  // Nothing on a GPU: no range for the offloaded blocks to continue.
  try {
    ring_stages(Map{{"", "disk"}}, dev(), 1);
    FAIL() << "a map without a GPU block was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no block is on a GPU"), std::string::npos) << e.what();
  }
  try {
    ring_stages(Map{{"transformer_blocks", 0}, {"single_transformer_blocks", "nvme"}}, dev(), 1);
    FAIL() << "an unknown device was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"nvme\""), std::string::npos) << e.what();
  }
}

TEST(RingStages, PlanShowsTheSameAssignment) {
  // `plan` prints map_ranks' ring: the offloaded blocks appear under the rank that runs them.
  const auto ranks = map_ranks(auto_like_map(), dev());
  EXPECT_EQ(ranks.ranks, 2);
  EXPECT_TRUE(ranks.unsupported.empty()) << ranks.unsupported;
  const auto json = to_json(ranks);
  ASSERT_EQ(json["ring"].size(), 2u);
  EXPECT_EQ(json["ring"][1]["text"], "rank 1 blocks [19, 57), 28 offloaded (29-46 cpu, 47-56 disk)");
  EXPECT_EQ(json["ring"][1]["offloaded"].size(), 28u);
  EXPECT_EQ(json["ring"][1]["offloaded"][27]["tier"], "disk");
  EXPECT_FALSE(json["ring"][0].contains("offloaded"));
}

}  // namespace
}  // namespace dp::placement
