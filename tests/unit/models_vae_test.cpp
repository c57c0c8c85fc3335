// AutoencoderKL against diffusers (tests/reference/cases_encoders.py): decode (and encode) of tiny random
// VAEs saved with save_pretrained, FLUX-like and SD-like configs, fp32 and bf16; config parsing and errors; on
// CUDA, the group norm kernel against ATen's.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json_file.h"
#include "encoders_oracle.h"
#include "models/flux/flux_fused.h"
#include "models/vae/vae.h"
#include "models/vae/vae_blocks.h"
#include "test_support.h"

namespace dp::models {
namespace {

namespace fs = std::filesystem;
using dp::test::OracleCase;

constexpr double kFp32Tolerance = 1e-4;  // see models_text_encoders_test.cpp
// Bitwise equal today (same ATen kernels, same order); two bf16 ulps of the output scale (2 * 2^-8) of
// headroom for a kernel that rounds once differently. See models_text_encoders_test.cpp.
constexpr double kBf16Tolerance = 8e-3;

const char* const kFluxDevVaeConfig = R"({"_class_name":"AutoencoderKL","_diffusers_version":"0.30.0.dev0",
  "act_fn":"silu","block_out_channels":[128,256,512,512],"down_block_types":["DownEncoderBlock2D",
  "DownEncoderBlock2D","DownEncoderBlock2D","DownEncoderBlock2D"],"force_upcast":true,"in_channels":3,
  "latent_channels":16,"latents_mean":null,"latents_std":null,"layers_per_block":2,"mid_block_add_attention":true,
  "norm_num_groups":32,"out_channels":3,"sample_size":1024,"scaling_factor":0.3611,"shift_factor":0.1159,
  "up_block_types":["UpDecoderBlock2D","UpDecoderBlock2D","UpDecoderBlock2D","UpDecoderBlock2D"],
  "use_post_quant_conv":false,"use_quant_conv":false})";

TEST(VaeConfig, ParsesFluxDevConfig) {
  const auto c = VaeConfig::from_json(nlohmann::json::parse(kFluxDevVaeConfig), "vae/config.json");
  EXPECT_EQ(c.latent_channels, 16);
  EXPECT_EQ(c.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(c.layers_per_block, 2);
  EXPECT_EQ(c.spatial_scale(), 8);
  EXPECT_DOUBLE_EQ(c.scaling_factor, 0.3611);
  ASSERT_TRUE(c.shift_factor.has_value());
  EXPECT_DOUBLE_EQ(*c.shift_factor, 0.1159);
  EXPECT_FALSE(c.use_quant_conv);
  EXPECT_FALSE(c.use_post_quant_conv);
  EXPECT_TRUE(c.mid_block_add_attention);
  EXPECT_TRUE(c.latents_mean.empty());
}

TEST(VaeConfig, RejectsWhatTheDecoderCannotBuild) {
  auto error_of = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json doc = nlohmann::json::parse(kFluxDevVaeConfig);
    edit(doc);
    try {
      VaeConfig::from_json(doc, "vae/config.json");
    } catch (const dp::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of([](auto& c) { c["norm_num_groups"] = 48; }).find("multiple of norm_num_groups"), std::string::npos);
  EXPECT_NE(error_of([](auto& c) { c["up_block_types"][1] = "AttnUpDecoderBlock2D"; }).find("AttnUpDecoderBlock2D"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& c) { c["down_block_types"].erase(0); }).find("one entry per block_out_channels"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& c) { c["act_fn"] = "softsign"; }).find("unsupported act_fn"), std::string::npos);
  EXPECT_NE(error_of([](auto& c) { c["scaling_factor"] = "x"; }).find("vae/config.json"), std::string::npos);
}

void check_vae(const std::string& case_name, at::ScalarType dtype, double tolerance) {
  const OracleCase oracle(case_name);
  const auto vae = AutoencoderKL::load(oracle.path("model"), dtype, at::kCPU, /*with_encoder=*/true);
  const std::string suffix = "." + dp::test::dtype_suffix(dtype);
  const at::Tensor latents = oracle.tensor("latents", dtype);

  const at::Tensor decoder_input = vae.unscale_latents(latents);
  dp::test::expect_close(case_name, "decoder_input" + suffix, decoder_input, oracle.tensor("decoder_input" + suffix),
                         dtype == at::kFloat ? 1e-7 : kBf16Tolerance);
  const at::Tensor sample = vae.decode(oracle.tensor("decoder_input" + suffix, dtype));
  EXPECT_EQ(sample.scalar_type(), dtype);
  dp::test::expect_close(case_name, "sample" + suffix, sample, oracle.tensor("sample" + suffix), tolerance);

  const auto posterior = vae.encode(oracle.tensor("image", dtype));
  dp::test::expect_close(case_name, "latent_mean" + suffix, posterior.mean, oracle.tensor("latent_mean" + suffix),
                         tolerance);
  dp::test::expect_close(case_name, "latent_logvar" + suffix, posterior.logvar,
                         oracle.tensor("latent_logvar" + suffix), tolerance);
}

TEST(AutoencoderKL, FluxLikeMatchesDiffusersFp32) { check_vae("vae_flux_like", at::kFloat, kFp32Tolerance); }
TEST(AutoencoderKL, FluxLikeMatchesDiffusersBf16) { check_vae("vae_flux_like", at::kBFloat16, kBf16Tolerance); }
TEST(AutoencoderKL, QuantConvMatchesDiffusersFp32) { check_vae("vae_quant_conv", at::kFloat, kFp32Tolerance); }
TEST(AutoencoderKL, NoMidAttentionMatchesDiffusersFp32) {
  check_vae("vae_no_mid_attention", at::kFloat, kFp32Tolerance);
}

TEST(AutoencoderKL, ScalingRoundTrips) {
  const OracleCase oracle("vae_flux_like");
  const auto vae = AutoencoderKL::load(oracle.path("model"), at::kFloat, at::kCPU);
  const at::Tensor latents = oracle.tensor("latents");
  EXPECT_TRUE(at::allclose(vae.scale_latents(vae.unscale_latents(latents)), latents, 1e-6, 1e-6));
}

TEST(AutoencoderKL, DecoderOnlyLoadRefusesToEncode) {
  const OracleCase oracle("vae_flux_like");
  const auto vae = AutoencoderKL::load(oracle.path("model"), at::kFloat, at::kCPU);
  EXPECT_FALSE(vae.has_encoder());
  EXPECT_THROW(vae.encode(oracle.tensor("image")), dp::Error);
  EXPECT_THROW(vae.decode(at::zeros({1, 4, 3, 3})), dp::Error);  // 16 latent channels expected
}

std::string load_error_after_edit(const OracleCase& oracle, const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = dp::test::temp_dir("vae-edit");
  for (const auto& entry : fs::directory_iterator(oracle.path("model"))) {
    fs::copy(entry.path(), fs::path(dir) / entry.path().filename());
  }
  nlohmann::json config = read_json_file(dir + "/config.json");
  edit(config);
  dp::test::write_file(dir + "/config.json", config.dump());
  try {
    AutoencoderKL::load(dir, at::kFloat, at::kCPU, true);
  } catch (const dp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(AutoencoderKL, ErrorsNameTheFileAndTensor) {
  const OracleCase oracle("vae_flux_like");
  const std::string missing = load_error_after_edit(oracle, [](auto& c) { c["use_post_quant_conv"] = true; });
  EXPECT_NE(missing.find("post_quant_conv.weight"), std::string::npos) << missing;
  const std::string shape = load_error_after_edit(oracle, [](auto& c) { c["latent_channels"] = 8; });
  EXPECT_NE(shape.find("decoder.conv_in.weight"), std::string::npos) << shape;
  EXPECT_NE(shape.find("diffusion_pytorch_model.safetensors"), std::string::npos) << shape;
  try {
    AutoencoderKL::load(dp::test::temp_dir("vae-none") + "/absent", at::kFloat, at::kCPU);
    ADD_FAILURE() << "expected an error";
  } catch (const dp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("VAE folder not found"), std::string::npos);
  }
}

// ---- CUDA: the group norm kernel against ATen's group_norm (and silu) on the same GPU ----

// Two ulps of the storage type at the output's scale, as for the FLUX kernels (models_fused_test.cpp): the
// statistics are reduced in another order, so an fp32 rounding can flip a 16-bit one. In 16-bit types at most 2%
// of the elements may differ at all.
class GroupNormCuda : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override { DP_TEST_NEED_CUDA(); }
  void TearDown() override { flux::set_fused_kernels_enabled(true); }

  void expect_close(const at::Tensor& kernel_out, const at::Tensor& aten_out, const std::string& what) {
    const at::Tensor got = kernel_out.to(at::kFloat).cpu(), expected = aten_out.to(at::kFloat).cpu();
    const at::ScalarType dtype = GetParam();
    const double ulp = dtype == at::kBFloat16 ? 1.0 / 128 : dtype == at::kHalf ? 1.0 / 1024 : 1.0 / (1 << 23);
    const double scale = expected.abs().max().item<double>();
    const double max_difference = (got - expected).abs().max().item<double>();
    const double differing = ((got - expected).abs() > 0).to(at::kDouble).mean().item<double>();
    std::cout << what << " " << dtype << ": max difference " << max_difference << " (scale " << scale << "), "
              << differing * 100 << "% of elements differ\n";
    EXPECT_LE(max_difference, 2 * ulp * scale) << what;
    if (dtype != at::kFloat) {
      EXPECT_LE(differing, 0.02) << what;
    }
  }
};

TEST_P(GroupNormCuda, MatchesAtenWithAndWithoutSilu) {
  c10::InferenceMode guard;
  const at::ScalarType dtype = GetParam();
  struct Case {
    std::vector<int64_t> shape;
    int64_t groups;
  };
  // 16-byte packs (64x64, 16x16 with 16 channels a group), one-element packs (17x9), a 3-d (B, C, HW) input as the
  // attention's norm takes it, and a group larger than one statistics block (32 channels of 128x128).
  const std::vector<Case> cases{{{1, 128, 64, 64}, 32}, {{2, 96, 17, 9}, 32}, {{1, 512, 16, 16}, 32},
                                {{3, 64, 40}, 8}, {{1, 64, 128, 128}, 2}};
  uint64_t seed = 11;
  for (const Case& c : cases) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed++);
    const auto on_gpu = [&](const at::Tensor& t) { return t.to(at::kCUDA, dtype); };
    // An offset mean and a spread: the statistics must not lose the variance to cancellation.
    const at::Tensor x = on_gpu(at::randn(c.shape, generator) * 3 + 1.5);
    const int64_t channels = c.shape[1];
    GroupNorm norm{on_gpu(at::randn({channels}, generator) * 0.5 + 1), on_gpu(at::randn({channels}, generator) * 0.2),
                   c.groups, 1e-6};
    const at::Tensor reference = at::group_norm(x, c.groups, norm.weight, norm.bias, norm.eps);
    std::string what = "group_norm " + std::to_string(channels) + " channels, " + std::to_string(c.groups) + " groups";
    for (size_t d = 2; d < c.shape.size(); ++d) what += " x" + std::to_string(c.shape[d]);
    expect_close(norm(x), reference, what);
    expect_close(norm.with_silu(x), at::silu(reference), what + " + silu");
  }
}

// A view that is not contiguous goes through ATen, and the kernels' switch turns them off.
TEST_P(GroupNormCuda, OtherLayoutsAndTheSwitchTakeAten) {
  c10::InferenceMode guard;
  const at::ScalarType dtype = GetParam();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor x = at::randn({1, 64, 8, 8}, generator).to(at::kCUDA, dtype).transpose(2, 3);
  GroupNorm norm{at::ones({64}).to(at::kCUDA, dtype), at::zeros({64}).to(at::kCUDA, dtype), 32, 1e-6};
  EXPECT_TRUE(at::equal(norm(x), at::group_norm(x, 32, norm.weight, norm.bias, 1e-6)));
  flux::set_fused_kernels_enabled(false);
  const at::Tensor contiguous = x.contiguous();
  EXPECT_TRUE(at::equal(norm.with_silu(contiguous),
                        at::silu(at::group_norm(contiguous, 32, norm.weight, norm.bias, 1e-6))));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GroupNormCuda, ::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace
}  // namespace dp::models
