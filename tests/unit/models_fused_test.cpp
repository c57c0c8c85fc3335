// The fused FLUX steps: on CPU their ATen fallback must equal the unfused composition bit for bit (the
// offsets and layouts are the logic under test); on CUDA the kernels must agree with that fallback run on
// the same GPU, to within one rounding of the storage type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "models/flux/flux_fused.h"
#include "models/flux/flux_layers.h"
#include "test_support.h"

namespace dp::models::flux {
namespace {

at::Tensor random(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kFloat,
                  at::Device device = at::kCPU) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::TensorOptions().dtype(at::kFloat)).to(device, dtype);
}

RotaryTables test_rope(int64_t tokens) {
  // Positions as FLUX builds them: text rows at zero, image rows on a grid.
  at::Tensor ids = at::zeros({tokens, 3}, at::kFloat);
  for (int64_t i = 0; i < tokens; ++i) {
    ids[i][1] = static_cast<float>(i / 7);
    ids[i][2] = static_cast<float>(i % 7);
  }
  const int64_t axes[] = {16, 24, 24};
  return rotary_tables(ids, axes);
}

struct Projection {
  int64_t batch = 2, text = 5, image = 9, heads = 3, head_dim = 64, extra = 8;
};

// The unfused reference: split heads, RMSNorm each stream, concatenate [text, image], rotate.
AttentionInputs unfused(const at::Tensor& text_qkv, const at::Tensor& image_qkv, const at::Tensor& w_text,
                        const at::Tensor& w_image, const RotaryTables& rope, int64_t width, int64_t head_dim) {
  auto part = [&](const at::Tensor& qkv, int64_t index) {
    return qkv.narrow(-1, index * width, width).unflatten(-1, {-1, head_dim});
  };
  const at::Tensor q = at::cat({rms_norm(part(text_qkv, 0), w_text), rms_norm(part(image_qkv, 0), w_image)}, 1);
  const at::Tensor k = at::cat({rms_norm(part(text_qkv, 1), w_text), rms_norm(part(image_qkv, 1), w_image)}, 1);
  const at::Tensor v = at::cat({part(text_qkv, 2), part(image_qkv, 2)}, 1);
  return {apply_rotary(q, rope), apply_rotary(k, rope), v};
}

TEST(FusedAttentionInputs, CpuFallbackEqualsUnfusedJointAttention) {
  c10::InferenceMode guard;
  const Projection p;
  const int64_t width = p.heads * p.head_dim;
  const at::Tensor text_qkv = random({p.batch, p.text, 3 * width}, 1);
  // Extra columns after v (single blocks append the MLP projection) must be ignored.
  const at::Tensor image_qkv_wide = random({p.batch, p.image, 3 * width + p.extra}, 2);
  const at::Tensor image_qkv = image_qkv_wide.narrow(-1, 0, 3 * width);
  const at::Tensor w_text = random({p.head_dim}, 3), w_image = random({p.head_dim}, 4);
  const RotaryTables rope = test_rope(p.text + p.image);

  AttentionInputs fused = empty_attention_inputs(p.batch, p.text + p.image, p.heads, p.head_dim, text_qkv.options());
  fill_attention_inputs(text_qkv, w_text, w_text, rope, 0, fused);
  fill_attention_inputs(image_qkv_wide, w_image, w_image, rope, p.text, fused);
  const AttentionInputs expected = unfused(text_qkv, image_qkv, w_text, w_image, rope, width, p.head_dim);
  EXPECT_TRUE(at::equal(fused.q, expected.q));
  EXPECT_TRUE(at::equal(fused.k, expected.k));
  EXPECT_TRUE(at::equal(fused.v, expected.v));
}

TEST(FusedAttentionInputs, RejectsRowsOutsideTheOutput) {
  c10::InferenceMode guard;
  const at::Tensor qkv = random({1, 4, 3 * 2 * 8}, 5);
  const at::Tensor w = at::ones({8});
  AttentionInputs out = empty_attention_inputs(1, 6, 2, 8, qkv.options());
  try {
    fill_attention_inputs(qkv, w, w, test_rope(6), 3, out);
    FAIL() << "an offset past the end was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fall outside the 6 attention rows"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fill_attention_inputs(qkv, w, w, test_rope(5), 0, out), Error);  // rotary rows != 6
  EXPECT_THROW(fill_attention_inputs(qkv.narrow(-1, 0, 40), w, w, test_rope(6), 0, out), Error);  // too narrow
  EXPECT_THROW(fill_attention_inputs(qkv, at::ones({7}), w, test_rope(6), 0, out), Error);
}

TEST(FusedModulation, CpuFallbacksEqualTheUnfusedOps) {
  c10::InferenceMode guard;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = random({2, 7, 48}, 6, dtype), y = random({2, 7, 48}, 7, dtype);
    const at::Tensor mod = random({2, 6 * 48}, 8, dtype);
    const auto chunks = mod.chunk(6, 1);
    EXPECT_TRUE(at::equal(layer_norm_modulate(x, chunks[0], chunks[1]), modulate(layer_norm(x), chunks[0], chunks[1])));
    EXPECT_TRUE(at::equal(add_gated(x, chunks[2], y), x + chunks[2].unsqueeze(1) * y));
    const at::Tensor wide = random({2, 7, 100}, 9, dtype);
    const at::Tensor dst = at::zeros({2, 7, 120}, wide.options());
    gelu_tanh_into(wide.narrow(-1, 52, 48), dst.narrow(-1, 72, 48));
    EXPECT_TRUE(at::equal(dst.narrow(-1, 72, 48), at::gelu(wide.narrow(-1, 52, 48), "tanh")));
    EXPECT_EQ(dst.narrow(-1, 0, 72).abs().sum().item<double>(), 0.0);
  }
}

TEST(FusedLinearGelu, CpuFallbackEqualsLinearThenGelu) {
  c10::InferenceMode guard;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = random({2, 7, 48}, 40, dtype);
    const Linear layer{random({40, 48}, 41, dtype), random({40}, 42, dtype)};
    const at::Tensor dst = at::zeros({2, 7, 64}, x.options());
    linear_gelu_tanh_into(x, layer, dst.narrow(-1, 24, 40));
    EXPECT_TRUE(at::equal(dst.narrow(-1, 24, 40), at::gelu(at::linear(x, layer.weight, layer.bias), "tanh")));
    EXPECT_EQ(dst.narrow(-1, 0, 24).abs().sum().item<double>(), 0.0);
    EXPECT_TRUE(at::equal(linear_gelu_tanh(x, layer), at::gelu(at::linear(x, layer.weight, layer.bias), "tanh")));
  }
  const Linear layer{random({40, 48}, 43), random({40}, 44)};
  EXPECT_THROW(linear_gelu_tanh_into(random({2, 7, 47}, 45), layer, at::empty({2, 7, 40})), Error);
  EXPECT_THROW(linear_gelu_tanh_into(random({2, 7, 48}, 46), layer, at::empty({2, 7, 39})), Error);
}

TEST(FusedModulation, RejectsMismatchedShapes) {
  c10::InferenceMode guard;
  const at::Tensor x = random({2, 7, 48}, 10);
  EXPECT_THROW(layer_norm_modulate(x, random({2, 47}, 11), random({2, 48}, 12)), Error);
  EXPECT_THROW(layer_norm_modulate(x.flatten(0, 1), random({2, 48}, 11), random({2, 48}, 12)), Error);
  EXPECT_THROW(add_gated(x, random({1, 48}, 13), x), Error);
  EXPECT_THROW(gelu_tanh_into(x, at::empty({2, 7, 47})), Error);
}

// ---- CUDA: kernels against the ATen path on the same device ----

class FusedCuda : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override { DP_TEST_NEED_CUDA(); }
  void TearDown() override { set_fused_kernels_enabled(true); }

  template <typename F>
  std::pair<at::Tensor, at::Tensor> both_paths(F&& f) {
    set_fused_kernels_enabled(true);
    at::Tensor fused = f().to(at::kFloat).cpu();
    set_fused_kernels_enabled(false);
    at::Tensor reference = f().to(at::kFloat).cpu();
    set_fused_kernels_enabled(true);
    return {fused, reference};
  }

  // The two paths reduce in different orders, so an intermediate rounding can flip: allow two ulps of the
  // storage type at the tensor's scale. In 16-bit types at most 2% of the elements may differ at all (a wrong
  // formula changes nearly all of them); fp32 differs in its last bit almost everywhere, so only the bound holds.
  void expect_close(const at::Tensor& fused, const at::Tensor& reference, const char* what) {
    const at::ScalarType dtype = GetParam();
    const double ulp = dtype == at::kBFloat16 ? 1.0 / 128 : dtype == at::kHalf ? 1.0 / 1024 : 1.0 / (1 << 23);
    const double scale = reference.abs().max().item<double>();
    const double max_difference = (fused - reference).abs().max().item<double>();
    const double differing = ((fused - reference).abs() > 0).to(at::kDouble).mean().item<double>();
    std::cout << what << " " << dtype << ": max difference " << max_difference << " (scale " << scale << "), "
              << differing * 100 << "% of elements differ\n";
    EXPECT_LE(max_difference, 2 * ulp * scale) << what;
    if (dtype != at::kFloat) EXPECT_LE(differing, 0.02) << what;
  }
};

TEST_P(FusedCuda, AttentionInputsMatchAten) {
  c10::InferenceMode guard;
  const at::ScalarType dtype = GetParam();
  for (const int64_t head_dim : {128, 64, 6}) {
    const int64_t batch = 2, text = 33, image = 70, heads = 3, width = heads * head_dim;
    const at::Tensor text_qkv = random({batch, text, 3 * width}, 20, dtype, at::kCUDA);
    const at::Tensor image_qkv = random({batch, image, 3 * width + 16}, 21, dtype, at::kCUDA);
    const at::Tensor w_text = random({head_dim}, 22, dtype, at::kCUDA), w_image = random({head_dim}, 23, dtype, at::kCUDA);
    const RotaryTables rope{random({text + image, head_dim}, 24, at::kFloat, at::kCUDA),
                            random({text + image, head_dim}, 25, at::kFloat, at::kCUDA)};
    for (int which = 0; which < 3; ++which) {
      auto [fused, reference] = both_paths([&] {
        AttentionInputs out = empty_attention_inputs(batch, text + image, heads, head_dim, text_qkv.options());
        fill_attention_inputs(text_qkv, w_text, w_text, rope, 0, out);
        fill_attention_inputs(image_qkv, w_image, w_image, rope, text, out);
        return which == 0 ? out.q : which == 1 ? out.k : out.v;
      });
      expect_close(fused, reference, which == 0 ? "q" : which == 1 ? "k" : "v");
      if (which == 2) EXPECT_TRUE(at::equal(fused, reference));
    }
  }
}

TEST_P(FusedCuda, ModulationAndGatesMatchAten) {
  c10::InferenceMode guard;
  const at::ScalarType dtype = GetParam();
  for (const int64_t dim : {3072, 36}) {  // 36: not a multiple of the vector width, the scalar kernels
    const at::Tensor x = random({2, 129, dim}, 30, dtype, at::kCUDA) * 3 + 1;
    const at::Tensor y = random({2, 129, dim}, 31, dtype, at::kCUDA);
    const auto mod = random({2, 6 * dim}, 32, dtype, at::kCUDA).chunk(6, 1);
    auto [normed, normed_ref] = both_paths([&] { return layer_norm_modulate(x, mod[0], mod[1]); });
    expect_close(normed, normed_ref, "layer_norm_modulate");
    auto [gated, gated_ref] = both_paths([&] { return add_gated(x, mod[2], y); });
    expect_close(gated, gated_ref, "add_gated");
    const at::Tensor wide = random({2, 129, dim + 24}, 33, dtype, at::kCUDA) * 2;
    auto [gelu, gelu_ref] = both_paths([&] {
      const at::Tensor dst = at::zeros({2, 129, dim + 8}, wide.options());
      gelu_tanh_into(wide.narrow(-1, 24, dim), dst.narrow(-1, 8, dim));
      return dst;
    });
    expect_close(gelu, gelu_ref, "gelu_tanh");
  }
}

// cuBLASLt's bias + GELU epilogue against ATen's linear then gelu. The GEMMs may reduce in other orders
// and the epilogue rounds once instead of twice, so many 16-bit elements differ by an ulp; the bound is two
// ulps of the scale there, and 1e-5 of the scale in fp32, tight enough to tell the tanh GELU from the erf one
// (they differ by up to 5e-4 here) and any layout mistake (errors of order one).
TEST_P(FusedCuda, LinearGeluMatchesAten) {
  c10::InferenceMode guard;
  const at::ScalarType dtype = GetParam();
  const int64_t k = 768;
  for (const int64_t n : {1536, 40}) {
    const at::Tensor x = random({2, 129, k}, 50, dtype, at::kCUDA);
    const Linear layer{(random({n, k}, 51, at::kFloat, at::kCUDA) / std::sqrt(static_cast<double>(k))).to(dtype),
                       random({n}, 52, dtype, at::kCUDA) * 0.5};
    auto [fused, reference] = both_paths([&] {
      const at::Tensor dst = at::zeros({2, 129, n + 16}, x.options());
      linear_gelu_tanh_into(x, layer, dst.narrow(-1, 16, n));
      return dst;
    });
    const double ulp = dtype == at::kBFloat16 ? 1.0 / 128 : dtype == at::kHalf ? 1.0 / 1024 : 0;
    const double scale = reference.abs().max().item<double>();
    const double max_difference = (fused - reference).abs().max().item<double>();
    std::cout << "linear_gelu " << dtype << " n=" << n << ": max difference " << max_difference << " (scale " << scale
              << ")\n";
    EXPECT_LE(max_difference, dtype == at::kFloat ? 1e-5 * scale : 2 * ulp * scale);
    EXPECT_EQ(fused.narrow(-1, 0, 16).abs().sum().item<double>(), 0.0) << "wrote outside its columns";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedCuda, ::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace
}  // namespace dp::models::flux
