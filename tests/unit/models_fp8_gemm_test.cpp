// FP8 GEMMs (models/flux/fp8_gemm.h): the row quantiser and the layer product against their definitions written
// out here, and on CUDA the quantiser kernel and _scaled_mm against the CPU's ATen path. The whole transformer
// with --fp8-gemms is compared with diffusers in models_flux_test (Fp8GemmsMatchTheirDefinition).
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>

#include "core/error.h"
#include "models/flux/fp8_gemm.h"
#include "test_support.h"

namespace dp::models::flux {
namespace {

at::Tensor random(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kFloat) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

at::Tensor dequantised(const Fp8Rows& rows) { return rows.values.to(at::kDouble) * rows.scales.to(at::kDouble); }

Linear random_linear(int64_t in, int64_t out, uint64_t seed, at::ScalarType dtype) {
  Linear layer;
  layer.weight = random({out, in}, seed, dtype) / std::sqrt(static_cast<double>(in));
  layer.bias = random({out}, seed + 1, dtype);
  return layer;
}

TEST(Fp8Rows, EachRowsLargestMagnitudeBecomes448) {
  const at::Tensor x = random({6, 48}, 1) * at::arange(1, 7, at::kFloat).unsqueeze(1);  // rows of other scales
  const Fp8Rows q = quantize_rows_fp8(x);
  ASSERT_EQ(q.values.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(q.scales.sizes(), (std::vector<int64_t>{6, 1}));
  const at::Tensor largest = x.abs().amax({1}, true);
  EXPECT_TRUE(at::allclose(q.scales, largest / 448.0, 1e-7, 0));
  EXPECT_TRUE(at::equal(q.values.to(at::kFloat).abs().amax({1}), at::full({6}, 448.0f)));
  // e4m3 keeps 3 mantissa bits: a normal value is within 2^-4 of itself; below 2^-6 the step is 2^-9 (subnormals).
  const at::Tensor error = (dequantised(q) - x.to(at::kDouble)).abs();
  const at::Tensor allowed = x.to(at::kDouble).abs() / 16 + q.scales.to(at::kDouble) * std::ldexp(1.0, -10);
  EXPECT_TRUE((error <= allowed).all().item<bool>()) << "largest excess " << (error - allowed).max().item<double>();
}

TEST(Fp8Rows, ZeroRowsStayZeroAndOtherShapesAreRefused) {
  const Fp8Rows q = quantize_rows_fp8(at::zeros({2, 32}, at::kBFloat16));
  EXPECT_TRUE(at::equal(q.values.to(at::kFloat), at::zeros({2, 32})));
  EXPECT_FALSE(q.scales.isnan().any().item<bool>());
  EXPECT_THROW(quantize_rows_fp8(at::zeros({2, 3, 32})), Error);
  EXPECT_THROW(quantize_rows_fp8(at::zeros({2, 32}, at::kInt)), Error);
}

TEST(Fp8Linear, ConvertsWholeTensorCoreTilesOnly) {
  c10::InferenceMode guard;
  const Linear layer = random_linear(32, 48, 3, at::kBFloat16);
  const Linear fp8 = to_fp8(layer);
  EXPECT_EQ(fp8.weight.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(fp8.weight.sizes(), layer.weight.sizes());
  EXPECT_EQ(fp8.weight_scale.sizes(), (std::vector<int64_t>{48}));
  EXPECT_TRUE(at::equal(fp8.bias, layer.bias));
  const Linear odd = to_fp8(random_linear(24, 40, 4, at::kBFloat16));  // 24 is no multiple of 16
  EXPECT_EQ(odd.weight.scalar_type(), at::kBFloat16);
  EXPECT_FALSE(odd.weight_scale.defined());
  EXPECT_THROW(Linear::concat({fp8, fp8}), Error) << "quantise after concatenating, never before";
}

TEST(Fp8Linear, ProductIsTheDequantisedOperandsProduct) {
  c10::InferenceMode guard;
  const Linear layer = random_linear(64, 32, 5, at::kBFloat16);
  const Linear fp8 = to_fp8(layer);
  const at::Tensor x = random({2, 5, 64}, 6, at::kBFloat16);
  const at::Tensor y = fp8(x);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 5, 32}));
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  // The definition in double: each operand's FP8 values times its scales, then x W^T + b.
  const at::Tensor lhs = dequantised(quantize_rows_fp8(x.reshape({-1, 64})));
  const at::Tensor rhs = fp8.weight.to(at::kDouble) * fp8.weight_scale.to(at::kDouble).unsqueeze(1);
  const at::Tensor expected = (at::matmul(lhs, rhs.t()) + layer.bias.to(at::kDouble)).reshape({2, 5, 32});
  const double scale = expected.abs().max().item<double>();
  EXPECT_LE((y.to(at::kDouble) - expected).abs().max().item<double>(), scale / 128) << "more than a bf16 ulp";
  // And FP8 stays near the unquantised layer: two e4m3 roundings of at most 2^-4 each, averaging out over 64.
  const double drift = (y.to(at::kDouble) - layer(x).to(at::kDouble)).pow(2).mean().sqrt().item<double>() /
                       expected.pow(2).mean().sqrt().item<double>();
  std::cout << "FP8 against bf16, rms relative: " << drift << "\n";
  EXPECT_LT(drift, 0.05);
  EXPECT_GT(drift, 0.0);
}

TEST(Fp8Rows, JoinedRowsAreTheConcatenationThroughItsGelu) {
  const at::Tensor attention = random({9, 32}, 10, at::kBFloat16), mlp = random({9, 64}, 11, at::kBFloat16) * 4;
  const Fp8Rows joined = quantize_rows_fp8(attention, false, mlp, true);
  const Fp8Rows expected = quantize_rows_fp8(at::cat({attention, at::gelu(mlp, "tanh")}, 1));
  EXPECT_TRUE(at::equal(joined.scales, expected.scales));
  EXPECT_TRUE(at::equal(joined.values.view(at::kByte), expected.values.view(at::kByte)));
  EXPECT_THROW(quantize_rows_fp8(attention, false, mlp.slice(0, 1), true), Error) << "rows must pair up";
  EXPECT_THROW(quantize_rows_fp8(attention, false, mlp.to(at::kFloat), true), Error) << "one dtype";
}

// The CUDA quantiser's division-free quotient (quotient() in models/flux/cuda/fp8_quantize.cu) written out on the
// host: the product by the correctly rounded reciprocal, corrected once by its exact residual, with the dividend's
// sign, must be the IEEE quotient, bit for bit, for every value the kernel divides (Markstein's theorem outside
// underflow; below it the e4m3 code is a signed 0 either way, so only the sign must hold there).
TEST(Fp8Quotient, ReciprocalProductCorrectedByItsResidualIsTheIeeeQuotient) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  const int64_t n = 1 << 20;
  const at::Tensor normal = at::randn({n}, generator);
  const std::vector<std::pair<const char*, at::Tensor>> kinds = {
      {"random", normal * 3},
      {"gelu bf16", at::gelu(normal * 3, "tanh").to(at::kBFloat16).to(at::kFloat)},
      {"ten decades", (at::rand({n}, generator) - 0.5) * at::pow(10.0, at::rand({n}, generator) * 10 - 8)},
      {"bf16 integers", at::round(normal * 100).to(at::kBFloat16).to(at::kFloat)},
  };
  for (const auto& [name, values] : kinds) {
    const at::Tensor x = values.contiguous();
    const float* data = x.data_ptr<float>();
    const float scale = std::max(x.abs().max().item<float>(), 1e-12f) / 448.0f;
    const float reciprocal = 1.0f / scale;
    int64_t differing = 0, zeros_of_the_wrong_sign = 0;
    for (int64_t i = 0; i < n; ++i) {
      const volatile float product = data[i] * reciprocal;  // rounded on its own, as __fmul_rn, never fused
      const float residual = std::fma(-product, scale, data[i]);
      const float corrected = std::copysign(std::fma(residual, reciprocal, product), data[i]);
      const float ieee = data[i] / scale;
      if (std::fabs(ieee) < std::numeric_limits<float>::min()) {
        zeros_of_the_wrong_sign += std::signbit(corrected) != std::signbit(ieee);
        continue;
      }
      differing += std::memcmp(&corrected, &ieee, sizeof(float)) != 0;
    }
    EXPECT_EQ(differing, 0) << name;
    EXPECT_EQ(zeros_of_the_wrong_sign, 0) << name;
  }
}

TEST(Fp8Support, TheCpuEmulatesAnyDtype) {
  EXPECT_NO_THROW(check_fp8_gemms_supported(at::kFloat, at::kCPU));
  EXPECT_NO_THROW(check_fp8_gemms_supported(at::kBFloat16, at::kCPU));
}

// ---- CUDA: the kernel and _scaled_mm against the CPU's ATen path ----

class Fp8Cuda : public ::testing::Test {
 protected:
  void SetUp() override { DP_TEST_NEED_CUDA(); }
};

TEST_F(Fp8Cuda, QuantiserKernelGivesTheAtenBits) {
  for (const auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    // The vector path, the scalar one, and (fp32 at 16384 columns: 64 KB) rows too wide to keep in shared memory.
    for (const int64_t columns : {3072, 40, 13, 16384}) {
      const at::Tensor x = random({37, columns}, 7, dtype) * 3;
      const Fp8Rows on_gpu = quantize_rows_fp8(x.cuda());
      const Fp8Rows on_cpu = quantize_rows_fp8(x);
      EXPECT_TRUE(at::equal(on_gpu.scales.cpu(), on_cpu.scales)) << dtype << " " << columns;
      EXPECT_TRUE(at::equal(on_gpu.values.cpu().view(at::kByte), on_cpu.values.view(at::kByte))) << dtype << " "
                                                                                                   << columns;
    }
  }
}

TEST_F(Fp8Cuda, QuotientsWithoutADivisionGiveTheAtenBitsOnHardRows) {
  // The kernel divides by a correction of the reciprocal's product (quotient() in fp8_quantize.cu). Rows where
  // that is hardest: GELU's -0 and tiny negatives, values spread over ten decades, and integers, whose quotients
  // often fall exactly on a midpoint of two e4m3 codes (a tie, rounded to even).
  auto generator = at::make_generator<at::CPUGeneratorImpl>(21);
  const at::Tensor normal = at::randn({64, 3072}, generator);
  const at::Tensor decades = at::pow(10.0, at::rand({64, 3072}, generator) * 10 - 8);
  const std::vector<std::pair<const char*, at::Tensor>> rows = {
      {"gelu", at::gelu(normal * 4, "tanh")},
      {"decades", (at::rand({64, 3072}, generator) - 0.5) * decades},
      {"integers", at::round(normal * 100)},
  };
  for (const auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (const auto& [name, values] : rows) {
      const at::Tensor x = values.to(dtype);
      const Fp8Rows on_gpu = quantize_rows_fp8(x.cuda());
      const Fp8Rows on_cpu = quantize_rows_fp8(x);
      EXPECT_TRUE(at::equal(on_gpu.scales.cpu(), on_cpu.scales)) << dtype << " " << name;
      EXPECT_TRUE(at::equal(on_gpu.values.cpu().view(at::kByte), on_cpu.values.view(at::kByte))) << dtype << " "
                                                                                                   << name;
    }
  }
}

TEST_F(Fp8Cuda, JoinedRowsMatchTheirConcatenationOnTheGpu) {
  // The kernel's GELU against ATen's CUDA GELU, then the plain quantiser: the same formula, so the same codes.
  // bf16 rows (30 KB) are kept in shared memory between the two passes; fp32 ones (60 KB) are read twice.
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const at::Tensor attention = random({300, 3072}, 12, dtype).cuda();
    const at::Tensor mlp = (random({300, 12288}, 13, dtype) * 3).cuda();
    const Fp8Rows joined = quantize_rows_fp8(attention, false, mlp, true);
    const Fp8Rows expected = quantize_rows_fp8(at::cat({attention, at::gelu(mlp, "tanh")}, 1));
    EXPECT_TRUE(at::equal(joined.scales, expected.scales)) << dtype;
    const double differing =
        (joined.values.view(at::kByte) != expected.values.view(at::kByte)).to(at::kDouble).mean().item<double>();
    std::cout << dtype << " joined rows against ATen's GELU and concatenation: " << differing * 100
              << "% of codes differ\n";
    EXPECT_LE(differing, 1e-3) << dtype;
    // The MLP's own path: the hidden layer alone through its GELU (in fp32 a row of exactly 48 KB, which with the
    // kernel's static shared memory is one over what a launch may take: it is read twice instead).
    const Fp8Rows hidden = quantize_rows_fp8(mlp, true, at::Tensor(), false);
    EXPECT_TRUE(at::allclose(hidden.scales, quantize_rows_fp8(at::gelu(mlp, "tanh")).scales, 1e-2, 0)) << dtype;
  }
}

TEST_F(Fp8Cuda, ScaledGemmMatchesTheCpuDefinition) {
  c10::InferenceMode guard;
  check_fp8_gemms_supported(at::kBFloat16, at::kCUDA);
  EXPECT_THROW(check_fp8_gemms_supported(at::kFloat, at::kCUDA), Error) << "FP8 on CUDA takes bf16 activations";
  const Linear layer = random_linear(3072, 512, 8, at::kBFloat16);
  const Linear fp8 = to_fp8(layer);
  const at::Tensor x = random({1, 300, 3072}, 9, at::kBFloat16);
  const at::Tensor on_cpu = fp8(x).to(at::kFloat);
  const Linear fp8_gpu = fp8.map([](const at::Tensor& t) { return t.cuda(); });
  const at::Tensor on_gpu = fp8_gpu(x.cuda()).cpu().to(at::kFloat);
  const double scale = on_cpu.abs().max().item<double>();
  const double difference = (on_gpu - on_cpu).abs().max().item<double>();
  std::cout << "_scaled_mm against the CPU definition: max difference " << difference << " (scale " << scale << ")\n";
  EXPECT_LE(difference, 2 * scale / 128) << "two bf16 ulps: only the summation order and one rounding differ";
  // Converting on the GPU gives the CPU's FP8 weight.
  const Linear converted_on_gpu = to_fp8(layer.map([](const at::Tensor& t) { return t.cuda(); }));
  EXPECT_TRUE(at::equal(converted_on_gpu.weight.cpu().view(at::kByte), fp8.weight.view(at::kByte)));
}

}  // namespace
}  // namespace dp::models::flux
