// encoder_attention: the same arithmetic as LibTorch's scaled_dot_product_attention, on the CPU through it,
// on CUDA through flash or memory-efficient attention (models/attention.h says why).
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <iostream>

#include "models/attention.h"
#include "test_support.h"

namespace dp::models {
namespace {

struct AttentionCase {
  const char* name;
  int64_t batch, heads, queries, keys, head_dim;
  bool bias, causal;
  std::optional<double> scale;
};

// The encoders' shapes at small sizes, odd lengths among them (a bias row of 7 keys needs padding to 16).
const AttentionCase kCases[] = {
    {"clip causal", 2, 4, 77, 77, 64, false, true, 0.125},
    {"t5 bias", 1, 4, 7, 7, 64, true, false, 1.0},
    {"t5 bias 512", 2, 3, 512, 512, 64, true, false, 1.0},
    {"vae one head", 1, 1, 256, 256, 512, false, false, std::nullopt},
    {"cross lengths", 1, 2, 9, 33, 32, false, false, std::nullopt},
};

struct Inputs {
  at::Tensor q, k, v;
  std::optional<at::Tensor> bias;
};

Inputs make_inputs(const AttentionCase& c, at::ScalarType dtype, const at::Device& device) {
  at::manual_seed(7);
  const auto options = at::TensorOptions().dtype(at::kFloat);
  Inputs in;
  // Laid out as the models do: (batch, tokens, heads, head_dim) transposed, so head_dim has unit stride.
  auto heads_view = [&](int64_t tokens) {
    return at::randn({c.batch, tokens, c.heads, c.head_dim}, options).transpose(1, 2).to(device, dtype);
  };
  in.q = heads_view(c.queries);
  in.k = heads_view(c.keys);
  in.v = heads_view(c.keys);
  // T5's position bias: one per head, broadcast over the batch.
  if (c.bias) in.bias = (at::randn({1, c.heads, c.queries, c.keys}, options) * 3).to(device, dtype);
  return in;
}

at::Tensor reference(const Inputs& in, const AttentionCase& c) {
  auto f = [](const at::Tensor& t) { return t.to(at::kCPU, at::kFloat); };
  std::optional<at::Tensor> bias;
  if (in.bias) bias = f(*in.bias);
  return at::scaled_dot_product_attention(f(in.q), f(in.k), f(in.v), bias, 0.0, c.causal, c.scale);
}

TEST(EncoderAttention, OnTheCpuIsLibTorchsDefault) {
  c10::InferenceMode guard;
  for (const AttentionCase& c : kCases) {
    const Inputs in = make_inputs(c, at::kFloat, at::kCPU);
    EXPECT_STREQ(encoder_attention_backend(in.q, in.k, in.v, in.bias), "default") << c.name;
    const at::Tensor out = encoder_attention(in.q, in.k, in.v, in.bias, c.causal, c.scale);
    EXPECT_TRUE(at::equal(out, reference(in, c))) << c.name;
  }
}

class EncoderAttentionCuda : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override { DP_TEST_NEED_CUDA(); }
};

TEST_P(EncoderAttentionCuda, FusedBackendsMatchTheCpu) {
  c10::InferenceMode guard;
  const at::ScalarType dtype = GetParam();
  for (const AttentionCase& c : kCases) {
    const Inputs in = make_inputs(c, dtype, at::Device(at::kCUDA, 0));
    const std::string backend = encoder_attention_backend(in.q, in.k, in.v, in.bias);
    // Flash takes 16-bit inputs without a bias up to head_dim 256; the rest goes to memory-efficient attention.
    const bool flash = dtype != at::kFloat && !c.bias && c.head_dim <= 256;
    EXPECT_EQ(backend, flash ? "flash" : "efficient") << c.name;
    const at::Tensor out = encoder_attention(in.q, in.k, in.v, in.bias, c.causal, c.scale).to(at::kCPU, at::kFloat);
    // Against fp32 on the CPU from the same (rounded) inputs: the output's own rounding, a few ulps of its scale.
    const at::Tensor expected = reference(in, c);
    const double scale = expected.abs().max().item<double>();
    const double difference = (out - expected).abs().max().item<double>();
    const double ulp = dtype == at::kBFloat16 ? 1.0 / 128 : dtype == at::kHalf ? 1.0 / 1024 : 1.0 / (1 << 20);
    std::cout << c.name << " " << dtype << " via " << backend << ": max difference " << difference << " (scale "
              << scale << ")\n";
    EXPECT_EQ(out.sizes(), expected.sizes()) << c.name;
    EXPECT_LE(difference, 4 * ulp * scale) << c.name << " via " << backend;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EncoderAttentionCuda, ::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace
}  // namespace dp::models
