// AutoencoderKL against diffusers (tests/reference/cases_encoders.py): decode (and encode) of tiny random
// VAEs saved with save_pretrained, FLUX-like and SD-like configs, fp32 and bf16; config parsing and errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "core/json_file.h"
#include "encoders_oracle.h"
#include "models/vae/vae.h"
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

}  // namespace
}  // namespace dp::models
