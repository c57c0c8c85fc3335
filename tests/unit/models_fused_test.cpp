// The fused FLUX steps. On CPU, where they run as an ATen composition, they are checked against the
// definitions written out below in double precision, not against the helpers they are built from (that
// compared an expression with itself): diffusers' LayerNorm, RMSNorm, rotary embedding, tanh GELU and
// nn.Linear. On CUDA the kernels must agree with that ATen path run on the same GPU, to within one rounding
// of the storage type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <utility>
#include <vector>

#include "core/error.h"
#include "models/flux/flux_fused.h"
#ifdef DIFFPIPE_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>

#include "models/flux/cuda/modulation_rows.h"
#endif
#include "models/flux/flux_layers.h"
#include "test_support.h"

namespace dp::models::flux {
namespace {

at::Tensor random(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kFloat,
                  at::Device device = at::kCPU) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::TensorOptions().dtype(at::kFloat)).to(device, dtype);
}

// ---- the definitions, in double ----

at::Tensor f64(const at::Tensor& t) { return t.to(at::kDouble); }

// nn.LayerNorm(D, elementwise_affine=False, eps=1e-6): (x - mean) / sqrt(biased variance + eps).
at::Tensor plain_layer_norm(const at::Tensor& x) {
  const at::Tensor v = f64(x);
  const at::Tensor centred = v - v.mean(-1, /*keepdim=*/true);
  return centred / (centred.pow(2).mean(-1, /*keepdim=*/true) + 1e-6).sqrt();
}

// diffusers' RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * w.
at::Tensor plain_rms_norm(const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor v = f64(x);
  return v / (v.pow(2).mean(-1, /*keepdim=*/true) + 1e-6).sqrt() * f64(w);
}

// FluxPosEmbed for ids (S, 3): per axis of width d, frequencies 10000^(-2j/d) for j < d/2, each angle used
// by one (real, imaginary) pair of features, the axes side by side. Returns (cos, sin), both (S, sum of d).
std::pair<at::Tensor, at::Tensor> plain_rope_tables(const at::Tensor& ids, const std::vector<int64_t>& axes) {
  const int64_t tokens = ids.size(0);
  int64_t width = 0;
  for (const int64_t d : axes) width += d;
  at::Tensor cos = at::empty({tokens, width}, at::kDouble), sin = at::empty({tokens, width}, at::kDouble);
  auto c = cos.accessor<double, 2>(), s = sin.accessor<double, 2>();
  const at::Tensor positions = f64(ids);
  const auto pos = positions.accessor<double, 2>();
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t column = 0;
    for (size_t axis = 0; axis < axes.size(); ++axis) {
      const int64_t d = axes[axis];
      for (int64_t j = 0; j < d / 2; ++j) {
        const double angle = pos[t][static_cast<int64_t>(axis)] * std::pow(10000.0, -2.0 * static_cast<double>(j) / d);
        c[t][column + 2 * j] = c[t][column + 2 * j + 1] = std::cos(angle);
        s[t][column + 2 * j] = s[t][column + 2 * j + 1] = std::sin(angle);
      }
      column += d;
    }
  }
  return {cos, sin};
}

// apply_rotary_emb on x (B, S, H, D): each pair (a, b) of features becomes (a cos - b sin, b cos + a sin).
at::Tensor plain_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor v = f64(x);
  const at::Tensor a = v.slice(-1, 0, v.size(-1), 2), b = v.slice(-1, 1, v.size(-1), 2);
  const at::Tensor c = f64(cos).slice(-1, 0, cos.size(-1), 2).unsqueeze(0).unsqueeze(2);
  const at::Tensor s = f64(sin).slice(-1, 0, sin.size(-1), 2).unsqueeze(0).unsqueeze(2);
  return at::stack({a * c - b * s, b * c + a * s}, -1).flatten(-2);
}

// gelu(x, approximate="tanh") = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
at::Tensor plain_gelu_tanh(const at::Tensor& x) {
  const at::Tensor v = f64(x);
  return 0.5 * v * (1 + (std::sqrt(2.0 / M_PI) * (v + 0.044715 * v.pow(3))).tanh());
}

// nn.Linear: x W^T + b.
at::Tensor plain_linear(const at::Tensor& x, const Linear& layer) {
  return f64(x).matmul(f64(layer.weight).t()) + f64(layer.bias);
}

// `got` against the double-precision definition: at most `ulps` units in the last place of got's storage
// type, at the reference's largest magnitude. The ATen path rounds to the storage type where diffusers does
// (a few times per element); a wrong formula (an eps, a sign, shift and scale swapped, the erf GELU, a pair
// rotated the wrong way) is off by far more, and the inputs below are chosen so that each of those shows
// (a row and a token of small magnitude for the eps, |x| around 2 for the GELU variant).
void expect_matches_definition(const at::Tensor& got, const at::Tensor& reference, int ulps, const char* what) {
  const double ulp = got.scalar_type() == at::kBFloat16 ? 1.0 / 128
                     : got.scalar_type() == at::kHalf   ? 1.0 / 1024
                                                        : 1.0 / (1 << 23);
  const double scale = reference.abs().max().item<double>();
  const double difference = (f64(got) - reference).abs().max().item<double>();
  std::cout << what << " " << got.scalar_type() << ": " << difference / (ulp * scale) << " ulps from the definition\n";
  EXPECT_LE(difference, ulps * ulp * scale) << what << " " << got.scalar_type() << ": max difference " << difference
                                            << " at scale " << scale;
}

// x (B, T, D) with one row of tiny spread, where LayerNorm's eps (1e-6) decides the result.
at::Tensor rows_with_a_flat_one(int64_t batch, int64_t tokens, int64_t dim, uint64_t seed, at::ScalarType dtype) {
  at::Tensor x = random({batch, tokens, dim}, seed) * 2 + 0.5;
  x[0][1] = x[0][1] * 2e-3;
  return x.to(dtype);
}

struct Projection {
  int64_t batch = 2, text = 5, image = 9, heads = 3, head_dim = 64, extra = 8;
};

TEST(FusedAttentionInputs, CpuFallbackMatchesRmsNormAndRotaryDefinitions) {
  c10::InferenceMode guard;
  const Projection p;
  const int64_t width = p.heads * p.head_dim;
  const std::vector<int64_t> axes = {16, 24, 24};
  // Positions as FLUX builds them: text rows at zero, image rows on a grid (offset, so that no angle is 0).
  at::Tensor ids = at::zeros({p.text + p.image, 3}, at::kFloat);
  for (int64_t i = p.text; i < p.text + p.image; ++i) {
    ids[i][1] = static_cast<float>(1 + (i - p.text) / 3);
    ids[i][2] = static_cast<float>(2 + (i - p.text) % 3);
  }
  const auto [cos, sin] = plain_rope_tables(ids, axes);
  // The blocks take their tables from rotary_tables (flux_layers): the same definition holds for it.
  const RotaryTables rope = rotary_tables(ids, axes);
  expect_matches_definition(rope.cos, cos, 2, "rotary_tables cos");
  expect_matches_definition(rope.sin, sin, 2, "rotary_tables sin");

  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor text_qkv = random({p.batch, p.text, 3 * width}, 1, dtype);
    // Extra columns after v (single blocks append the MLP projection) must be ignored; one token of small
    // magnitude makes RMSNorm's eps matter.
    at::Tensor image_qkv = random({p.batch, p.image, 3 * width + p.extra}, 2);
    image_qkv[1][4] = image_qkv[1][4] * 1e-3;
    image_qkv = image_qkv.to(dtype);
    const at::Tensor w_text = (random({p.head_dim}, 3) + 1).to(dtype);
    const at::Tensor w_image = (random({p.head_dim}, 4) + 1).to(dtype);

    AttentionInputs fused = empty_attention_inputs(p.batch, p.text + p.image, p.heads, p.head_dim, text_qkv.options());
    fill_attention_inputs(text_qkv, w_text, w_text, rope, 0, fused);
    fill_attention_inputs(image_qkv, w_image, w_image, rope, p.text, fused);

    const auto head = [&](const at::Tensor& qkv, int64_t index) {
      return qkv.narrow(-1, index * width, width).unflatten(-1, {p.heads, p.head_dim});
    };
    for (int index = 0; index < 2; ++index) {  // q and k: RMSNorm per stream, then rotation by position
      const at::Tensor normed = at::cat({plain_rms_norm(head(text_qkv, index), w_text),
                                         plain_rms_norm(head(image_qkv, index), w_image)}, 1);
      expect_matches_definition(index == 0 ? fused.q : fused.k, plain_rotate(normed, cos, sin),
                                dtype == at::kFloat ? 8 : 4, index == 0 ? "q" : "k");
    }
    EXPECT_TRUE(at::equal(fused.v, at::cat({head(text_qkv, 2), head(image_qkv, 2)}, 1))) << "v is copied as is";
  }
}

TEST(FusedAttentionInputs, RejectsRowsOutsideTheOutput) {
  c10::InferenceMode guard;
  const at::Tensor qkv = random({1, 4, 3 * 2 * 8}, 5);
  const at::Tensor w = at::ones({8});
  AttentionInputs out = empty_attention_inputs(1, 6, 2, 8, qkv.options());
  // Tables of the right width (8), so that each call below fails for the reason named beside it.
  const auto rope = [](int64_t tokens) { return rotary_tables(at::zeros({tokens, 3}), std::vector<int64_t>{2, 2, 4}); };
  EXPECT_NO_THROW(fill_attention_inputs(qkv, w, w, rope(6), 2, out));
  try {
    fill_attention_inputs(qkv, w, w, rope(6), 3, out);
    FAIL() << "an offset past the end was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fall outside the 6 attention rows"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fill_attention_inputs(qkv, w, w, rope(5), 0, out), Error);  // rotary rows != 6
  EXPECT_THROW(fill_attention_inputs(qkv.narrow(-1, 0, 40), w, w, rope(6), 0, out), Error);  // too narrow
  EXPECT_THROW(fill_attention_inputs(qkv, at::ones({7}), w, rope(6), 0, out), Error);
}


TEST(FusedModulation, CpuFallbacksMatchTheDefinitions) {
  c10::InferenceMode guard;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = rows_with_a_flat_one(2, 7, 48, 6, dtype), y = random({2, 7, 48}, 7, dtype);
    const auto chunks = random({2, 6 * 48}, 8, dtype).chunk(6, 1);
    const at::Tensor& shift = chunks[0];
    const at::Tensor& scale = chunks[1];
    const at::Tensor& gate = chunks[2];
    expect_matches_definition(layer_norm_modulate(x, shift, scale),
                              plain_layer_norm(x) * (1 + f64(scale).unsqueeze(1)) + f64(shift).unsqueeze(1),
                              dtype == at::kFloat ? 8 : 4, "layer_norm_modulate");
    expect_matches_definition(add_gated(x, gate, y), f64(x) + f64(gate).unsqueeze(1) * f64(y),
                              dtype == at::kFloat ? 4 : 2, "add_gated");
    // A column range of a wider source into a column range of a wider destination; |x| up to about 6.
    const at::Tensor wide = (random({2, 7, 100}, 9) * 2).to(dtype);
    const at::Tensor dst = at::zeros({2, 7, 120}, wide.options());
    gelu_tanh_into(wide.narrow(-1, 52, 48), dst.narrow(-1, 72, 48));
    expect_matches_definition(dst.narrow(-1, 72, 48), plain_gelu_tanh(wide.narrow(-1, 52, 48)),
                              dtype == at::kFloat ? 4 : 2, "gelu_tanh_into");
    EXPECT_EQ(dst.narrow(-1, 0, 72).abs().sum().item<double>(), 0.0) << "wrote outside its columns";
  }
}

TEST(FusedLinearGelu, CpuFallbackMatchesLinearThenGeluDefinitions) {
  c10::InferenceMode guard;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = random({2, 7, 48}, 40, dtype);
    const Linear layer{(random({40, 48}, 41) / 4).to(dtype), random({40}, 42, dtype), nullptr, {}};
    // diffusers rounds the linear's output to the storage type before the GELU.
    const at::Tensor expected = plain_gelu_tanh(plain_linear(x, layer).to(dtype));
    const at::Tensor dst = at::zeros({2, 7, 64}, x.options());
    linear_gelu_tanh_into(x, layer, dst.narrow(-1, 24, 40));
    expect_matches_definition(dst.narrow(-1, 24, 40), expected, dtype == at::kFloat ? 8 : 2, "linear_gelu_tanh_into");
    EXPECT_EQ(dst.narrow(-1, 0, 24).abs().sum().item<double>(), 0.0) << "wrote outside its columns";
    expect_matches_definition(linear_gelu_tanh(x, layer), expected, dtype == at::kFloat ? 8 : 2, "linear_gelu_tanh");
    // Linear itself (module_weights.h), which the blocks' other projections use.
    expect_matches_definition(layer(x), plain_linear(x, layer), dtype == at::kFloat ? 8 : 1, "Linear");
  }
  const Linear layer{random({40, 48}, 43), random({40}, 44), nullptr, {}};
  EXPECT_THROW(linear_gelu_tanh_into(random({2, 7, 47}, 45), layer, at::empty({2, 7, 40})), Error);
  EXPECT_THROW(linear_gelu_tanh_into(random({2, 7, 48}, 46), layer, at::empty({2, 7, 39})), Error);
}

// Off CUDA the modulation rows are the layer's own linear, bit for bit.
TEST(FusedModulation, ModulationRowsOnCpuAreTheLinear) {
  const at::Tensor act = random({3, 20}, 70);
  const Linear layer{random({12, 20}, 71), random({12}, 72), nullptr, {}};
  EXPECT_TRUE(at::equal(modulation_rows(layer, act), at::linear(act, layer.weight, layer.bias)));
  EXPECT_THROW(modulation_rows(layer, random({3, 21}, 73)), Error);
  EXPECT_THROW(modulation_rows(layer, random({3, 1, 20}, 74)), Error);
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
    if (dtype != at::kFloat) {
      EXPECT_LE(differing, 0.02) << what;
    }
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
      if (which == 2) {
        EXPECT_TRUE(at::equal(fused, reference));
      }
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
                       random({n}, 52, dtype, at::kCUDA) * 0.5, nullptr, {}};
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

// The modulation rows' kernel against ATen's linear (cuBLAS), and what it exists for: a row comes out bit for bit
// the same whether it is computed alone, with a few others or with a whole schedule's rows, and whether the weight
// sits on 16 bytes (resident) or not (a streamed copy). Shapes: FLUX-like; wider than what a block stages of x at
// once (several tiles of chunks, the last one partial), with a feature count no warp's share divides; and widths
// that are no multiple of the 16-byte chunk (the element-by-element loads).
TEST_P(FusedCuda, ModulationRowsMatchAtenAndDoNotDependOnTheRowCount) {
  c10::InferenceMode guard;
  const at::ScalarType dtype = GetParam();
  set_modulation_table_override(true);  // the kernel; both_paths' other side is ATen's linear
  for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{{3072, 1536}, {5000, 40}, {40, 24}, {36, 7}}) {
    const at::Tensor act = at::silu(random({28, k}, 60, dtype, at::kCUDA));
    const Linear layer{(random({n, k}, 61, at::kFloat, at::kCUDA) / std::sqrt(static_cast<double>(k))).to(dtype),
                       random({n}, 62, dtype, at::kCUDA), nullptr, {}};
    auto [fused, reference] = both_paths([&] { return modulation_rows(layer, act); });
    const double ulp = dtype == at::kBFloat16 ? 1.0 / 128 : dtype == at::kHalf ? 1.0 / 1024 : 0;
    const double scale = reference.abs().max().item<double>();
    const double max_difference = (fused - reference).abs().max().item<double>();
    std::cout << "modulation_rows " << dtype << " k=" << k << " n=" << n << ": max difference " << max_difference
              << " (scale " << scale << ")\n";
    EXPECT_LE(max_difference, dtype == at::kFloat ? 1e-5 * scale : 2 * ulp * scale);

    const at::Tensor all_rows = modulation_rows(layer, act);
    for (const int64_t row : {0, 7, 8, 27}) {
      EXPECT_TRUE(at::equal(modulation_rows(layer, act.narrow(0, row, 1)), all_rows.narrow(0, row, 1)))
          << "row " << row << " alone differs from the same row among 28 (k=" << k << ")";
    }
    EXPECT_TRUE(at::equal(modulation_rows(layer, act.narrow(0, 5, 4)), all_rows.narrow(0, 5, 4)));
#ifdef DIFFPIPE_HAVE_CUDA
    // Every way of cutting the work (the bench times them against each other) gives the same bits.
    const auto type = dtype == at::kFloat  ? gpu::ElementType::F32
                      : dtype == at::kHalf ? gpu::ElementType::F16
                                           : gpu::ElementType::BF16;
    for (const auto shape : kernels::modulation_rows_shapes()) {
      const at::Tensor shaped = at::empty_like(all_rows);
      kernels::modulation_rows_shaped(shape, type, act.data_ptr(), layer.weight.data_ptr(), layer.bias.data_ptr(),
                                      act.size(0), n, k, shaped.data_ptr(), c10::cuda::getCurrentCUDAStream());
      EXPECT_TRUE(at::equal(shaped, all_rows)) << shape.features << " features a warp, " << shape.rows_per_block
                                               << " rows a block (k=" << k << ", n=" << n << ")";
    }
#endif
    // The same weight one element past a 16-byte boundary.
    const at::Tensor storage = at::empty({n * k + 1}, layer.weight.options());
    const at::Tensor shifted = storage.narrow(0, 1, n * k).view({n, k});
    shifted.copy_(layer.weight);
    const Linear unaligned{shifted, layer.bias, nullptr, {}};
    EXPECT_TRUE(at::equal(modulation_rows(unaligned, act), all_rows)) << "an unaligned weight sums in another order";
  }
  set_modulation_table_override(std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedCuda, ::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace
}  // namespace dp::models::flux
