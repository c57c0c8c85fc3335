// The activation-memory estimate generate checks before any work: figures worked out by hand for FLUX.1-dev,
// growth with the request, and what the machine reports as available.
#include <gtest/gtest.h>

#include "pipeline/memory_estimate.h"
#include "test_support.h"

namespace dp::pipeline {
namespace {

TEST(MemoryEstimate, FluxDevAt1024MatchesTheHandCount) {
  const auto flux = models::FluxConfig::flux_dev();
  const auto vae = models::VaeConfig::flux();
  const MemoryEstimate e = estimate_generate_memory({1, 1024, 1024, 512, at::kBFloat16}, flux, &vae);
  EXPECT_EQ(e.image_tokens, 64 * 64);
  EXPECT_EQ(e.sequence_length, 4096 + 512);
  EXPECT_DOUBLE_EQ(e.latents_bytes, 4.0 * 4096 * 64 * 2);
  EXPECT_DOUBLE_EQ(e.transformer_bytes, 13.0 * 4608 * 3072 * 2);
  // The decoder's largest activations: 256 channels at full size (the last upsampler's), three at once,
  // plus the float32 image twice.
  EXPECT_DOUBLE_EQ(e.vae_decode_bytes, 3.0 * 256 * 1024 * 1024 * 2 + 2.0 * 3 * 1024 * 1024 * 4);
  EXPECT_DOUBLE_EQ(e.peak_bytes(), e.latents_bytes + e.vae_decode_bytes);
  // Well within an H200, and within a laptop: the estimate must never refuse a default run.
  EXPECT_LT(e.peak_bytes(), 2e9);
}

TEST(MemoryEstimate, GrowsWithTheRequestAndLatentsSkipTheDecoder) {
  const auto flux = models::FluxConfig::flux_dev();
  const auto vae = models::VaeConfig::flux();
  const auto base = estimate_generate_memory({1, 1024, 1024, 512, at::kBFloat16}, flux, &vae);
  const auto fp32 = estimate_generate_memory({1, 1024, 1024, 512, at::kFloat}, flux, &vae);
  const auto batch = estimate_generate_memory({4, 1024, 1024, 512, at::kBFloat16}, flux, &vae);
  const auto huge = estimate_generate_memory({1, 100000, 100000, 512, at::kBFloat16}, flux, &vae);
  const auto latents_only = estimate_generate_memory({1, 100000, 100000, 512, at::kBFloat16}, flux, nullptr);
  EXPECT_DOUBLE_EQ(fp32.peak_bytes(), 2 * base.peak_bytes() - 2.0 * 3 * 1024 * 1024 * 4);
  EXPECT_DOUBLE_EQ(batch.peak_bytes(), 4 * base.peak_bytes());
  EXPECT_GT(huge.peak_bytes(), 1e13);  // terabytes: refused on any machine
  EXPECT_EQ(latents_only.vae_decode_bytes, 0);
  EXPECT_GT(latents_only.transformer_bytes, 1e12);
}

TEST(MemoryEstimate, CountsTheUnfusedLoraPathAndTrueCfgsSecondPrediction) {
  const auto flux = models::FluxConfig::flux_dev();
  MemoryRequest request{2, 1024, 1024, 512, at::kBFloat16};
  const auto base = estimate_generate_memory(request, flux, nullptr);
  request.unfused_lora_rank = 64;
  request.true_cfg = true;
  const auto both = estimate_generate_memory(request, flux, nullptr);
  // A block's widest delta and its pre-GELU output (12288 wide each) and the rank-64 intermediate, per token.
  EXPECT_DOUBLE_EQ(both.unfused_lora_bytes, 2.0 * 4608 * (2 * 12288 + 64) * 2);
  EXPECT_DOUBLE_EQ(both.latents_bytes, base.latents_bytes * 6 / 4);  // two more copies: cond and uncond
  EXPECT_DOUBLE_EQ(both.peak_bytes(), base.peak_bytes() + both.unfused_lora_bytes + base.latents_bytes / 2);
}

TEST(MemoryEstimate, AvailableMemoryOnCpuIsMeasured) {
  const auto available = available_memory(at::Device(at::kCPU));
  EXPECT_GT(available.bytes, 0u);
  EXPECT_FALSE(available.source.empty());
}

}  // namespace
}  // namespace dp::pipeline
