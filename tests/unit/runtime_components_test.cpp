// Which text encoders a rank warms up, and whether a --max-memory cap leaves the warm-up room beside their
// weights (runtime::plan_encoder_warm_up), on a tiny pipeline folder.
#include <gtest/gtest.h>

#include "fixtures/tiny_pipeline.h"
#include "io/model_folder.h"
#include "io/torch_tensors.h"
#include "models/clip/clip_text_model.h"
#include "models/t5/t5_encoder.h"
#include "placement/component_placement.h"
#include "runtime/components.h"
#include "test_support.h"

namespace dp::runtime {
namespace {

constexpr int64_t kRows = 1, kSeq = 32;

struct TinyFolder {
  std::string dir = test::temp_dir("components-warm-up");
  fixtures::TinyPipelineReport report = fixtures::write_tiny_pipeline(dir, {});
  io::ModelFolder folder = io::ModelFolder::open(dir);

  int64_t weights(const std::string& component) const {
    return placement::component_bytes(folder.component(component), folder.config(component), io::DType::F32);
  }
  int64_t clip_warm_up() const { return models::ClipTextModel::warm_up_bytes(report.configs.clip, at::kFloat, kRows); }
  int64_t t5_warm_up() const { return models::T5Encoder::warm_up_bytes(report.configs.t5, at::kFloat, kRows, kSeq); }
};

EncoderWarmUp decide(const TinyFolder& tiny, const ComponentPlan& plan, const std::string& caps, int rank, int gpu) {
  return plan_encoder_warm_up(plan, tiny.folder, caps, at::kFloat, rank, gpu, kRows, kSeq);
}

TEST(EncoderWarmUp, WithoutACapEveryEncoderOnTheRankIsWarmed) {
  const TinyFolder tiny;
  const ComponentPlan all_on_0;  // no --pipeline-device-map: the coordinator runs both
  const auto on_0 = decide(tiny, all_on_0, "", 0, 0);
  EXPECT_TRUE(on_0.clip && on_0.t5);
  EXPECT_TRUE(on_0.reason.empty());
  const auto on_1 = decide(tiny, all_on_0, "", 1, 1);
  EXPECT_FALSE(on_1.clip || on_1.t5);
}

TEST(EncoderWarmUp, ACapAdmitsItExactlyWhenWeightsAndWarmUpFit) {
  const TinyFolder tiny;
  const ComponentPlan all_on_0;
  // Both encoders load on GPU 0; their warm-ups run one after the other, so the larger one counts.
  const int64_t needed = tiny.weights("text_encoder") + tiny.weights("text_encoder_2") +
                         std::max(tiny.clip_warm_up(), tiny.t5_warm_up());
  const auto fits = decide(tiny, all_on_0, "0=" + std::to_string(needed), 0, 0);
  EXPECT_TRUE(fits.clip && fits.t5);
  EXPECT_NE(fits.reason.find("fit the --max-memory cap of GPU 0"), std::string::npos) << fits.reason;
  const auto tight = decide(tiny, all_on_0, "0=" + std::to_string(needed - 1), 0, 0);
  EXPECT_FALSE(tight.clip || tight.t5);
  EXPECT_NE(tight.reason.find("do not fit"), std::string::npos) << tight.reason;
  // A cap on another GPU says nothing of this one.
  const auto other = decide(tiny, all_on_0, "1=1000", 0, 0);
  EXPECT_TRUE(other.clip && other.t5);
  EXPECT_TRUE(other.reason.empty());
}

TEST(EncoderWarmUp, EachRankCountsOnlyTheEncodersItRuns) {
  const TinyFolder tiny;
  ComponentPlan apart;  // as "balanced" places them on two equal GPUs: T5 (the larger) on 0, CLIP on 1
  apart.from_map = true;
  apart.t5.rank = 0;
  apart.clip.rank = 1;
  const int64_t clip_needed = tiny.weights("text_encoder") + tiny.clip_warm_up();
  const int64_t t5_needed = tiny.weights("text_encoder_2") + tiny.t5_warm_up();
  const std::string caps = "0=" + std::to_string(t5_needed) + ",1=" + std::to_string(clip_needed);
  const auto rank_0 = decide(tiny, apart, caps, 0, 0);
  EXPECT_TRUE(rank_0.t5 && !rank_0.clip);
  const auto rank_1 = decide(tiny, apart, caps, 1, 1);
  EXPECT_TRUE(rank_1.clip && !rank_1.t5);
  const auto rank_1_tight = decide(tiny, apart, "1=" + std::to_string(clip_needed - 1), 1, 1);
  EXPECT_FALSE(rank_1_tight.clip || rank_1_tight.t5);
  // An encoder the map puts on the CPU is never warmed on a GPU.
  apart.clip.on_cpu = true;
  apart.clip.rank = 0;
  const auto cpu_clip = decide(tiny, apart, "", 0, 0);
  EXPECT_TRUE(cpu_clip.t5 && !cpu_clip.clip);
}

}  // namespace
}  // namespace dp::runtime
