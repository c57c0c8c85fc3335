#include "models/flux/fp8_gemm.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include "models/flux/cuda/fp8_quantize.h"
#endif

namespace dp::models::flux {
namespace {

constexpr double kFp8Max = 448.0;  // e4m3fn's largest finite value
constexpr int64_t kFp8Granularity = 16;

std::atomic<int>& fp8_setting() {
  static std::atomic<int> setting = [] {
    const char* value = std::getenv("DIFFPIPE_FP8_GEMMS");
    return (value != nullptr && std::strcmp(value, "1") == 0) ? 1 : 0;
  }();
  return setting;
}

// The definition: ATen ops, dividing by tensors (a CPU scalar divisor becomes a multiplication by its
// reciprocal on CUDA, one rounding away from the kernel's division).
Fp8Rows quantize_rows_aten(const at::Tensor& x) {
  const auto fp32 = x.options().dtype(at::kFloat);
  const at::Tensor largest = x.abs().amax({-1}, /*keepdim=*/true).to(at::kFloat).clamp_min(1e-12);
  const at::Tensor scales = largest / at::scalar_tensor(kFp8Max, fp32);
  return {(x.to(at::kFloat) / scales).to(at::kFloat8_e4m3fn), scales};
}

#ifdef DIFFPIPE_HAVE_CUDA
bool quantise_with_kernel(const at::Tensor& x) {
  const auto type = x.scalar_type();
  return x.is_cuda() && (type == at::kFloat || type == at::kHalf || type == at::kBFloat16);
}

kernels::ElementType element_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return kernels::ElementType::F32;
    case at::kHalf: return kernels::ElementType::F16;
    default: return kernels::ElementType::BF16;
  }
}

// A (rows, columns) matrix whose rows are `row_stride` elements apart, or an undefined tensor (no columns).
kernels::Fp8Segment segment(const at::Tensor& x, bool gelu) {
  if (!x.defined()) return {};
  return {x.data_ptr(), x.size(1), x.stride(0), gelu};
}

Fp8Rows quantize_rows_kernel(const at::Tensor& first, bool gelu_first, const at::Tensor& second, bool gelu_second) {
  const int64_t rows = first.size(0), columns = first.size(1) + (second.defined() ? second.size(1) : 0);
  DP_CHECK(columns <= std::numeric_limits<int32_t>::max() && rows <= std::numeric_limits<int32_t>::max(),
           "FP8 rows of ", rows, " x ", columns, " exceed the quantiser kernel's 32-bit grid and column indices");
  Fp8Rows out{at::empty({rows, columns}, first.options().dtype(at::kFloat8_e4m3fn)),
              at::empty({rows, 1}, first.options().dtype(at::kFloat))};
  kernels::quantize_rows_fp8(element_type(first.scalar_type()), segment(first, gelu_first),
                             segment(second, gelu_second), rows, out.values.data_ptr(), out.scales.data_ptr<float>(),
                             c10::cuda::getCurrentCUDAStream(first.get_device()).stream());
  const cudaError_t status = cudaGetLastError();
  DP_CHECK(status == cudaSuccess, "CUDA kernel quantize_rows_fp8 failed to launch: ", cudaGetErrorString(status));
  return out;
}
#endif

Linear converted(const Linear& layer) { return layer.defined() ? to_fp8(layer) : layer; }

}  // namespace

bool fp8_gemms_enabled() { return fp8_setting().load() != 0; }
void set_fp8_gemms_enabled(bool enabled) { fp8_setting().store(enabled ? 1 : 0); }

void check_fp8_gemms_supported(at::ScalarType dtype, at::Device device) {
  if (!device.is_cuda()) return;
  DP_CHECK(dtype == at::kBFloat16, "--fp8-gemms on ", device.str(), " needs bf16 activations (--dtype bf16), got ",
           dtype);
#ifdef DIFFPIPE_HAVE_CUDA
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index());
  DP_CHECK(properties->major * 10 + properties->minor >= 89, "--fp8-gemms needs FP8 tensor cores (compute capability ",
           "8.9 or newer: Ada, Hopper, Blackwell); ", device.str(), " (", properties->name, ") is ", properties->major,
           ".", properties->minor);
#endif
}

Fp8Rows quantize_rows_fp8(const at::Tensor& x) { return quantize_rows_fp8(x, false, at::Tensor(), false); }

Fp8Rows quantize_rows_fp8(const at::Tensor& first, bool gelu_first, const at::Tensor& second, bool gelu_second) {
  const auto check_part = [&](const at::Tensor& x) {
    DP_CHECK(x.dim() == 2, "FP8 rows are quantised from a (rows, columns) matrix, got ", x.sizes());
    DP_CHECK(x.is_floating_point() && x.element_size() >= 2, "FP8 quantisation of a ", x.scalar_type(), " tensor");
  };
  check_part(first);
  if (second.defined()) {
    check_part(second);
    DP_CHECK(second.size(0) == first.size(0) && second.scalar_type() == first.scalar_type() &&
                 second.device() == first.device(),
             "FP8 rows joined from ", first.sizes(), " ", first.scalar_type(), " on ", first.device(), " and ",
             second.sizes(), " ", second.scalar_type(), " on ", second.device());
  }
#ifdef DIFFPIPE_HAVE_CUDA
  if (quantise_with_kernel(first)) {
    const auto rows_of = [](const at::Tensor& x) { return !x.defined() || x.stride(1) == 1 ? x : x.contiguous(); };
    return quantize_rows_kernel(rows_of(first), gelu_first, rows_of(second), gelu_second);
  }
#endif
  const auto part = [](const at::Tensor& x, bool gelu) { return gelu ? at::gelu(x, "tanh") : x; };
  if (!second.defined()) return quantize_rows_aten(part(first, gelu_first));
  return quantize_rows_aten(at::cat({part(first, gelu_first), part(second, gelu_second)}, 1));
}

bool takes_fp8_rows(const Linear& layer) { return layer.weight_scale.defined() && !layer.adapters; }

at::Tensor fp8_product(const Fp8Rows& rows, const Linear& layer, at::ScalarType dtype) {
  DP_CHECK(layer.weight_scale.defined(), "an FP8 product with a ", layer.weight.scalar_type(), " weight");
  DP_CHECK(rows.values.size(1) == layer.weight.size(1), "FP8 rows of ", rows.values.size(1), " columns for a layer ",
           layer.weight.sizes());
  const std::optional<at::Tensor> bias = layer.bias.defined() ? std::optional<at::Tensor>(layer.bias) : std::nullopt;
  if (rows.values.is_cuda()) {
    // Second operand column-major: the transposed view of the row-major (out, in) weight.
    return at::_scaled_mm(rows.values, layer.weight.t(), rows.scales, layer.weight_scale.view({1, -1}), bias,
                          std::nullopt, dtype);
  }
  const at::Tensor lhs = rows.values.to(at::kFloat) * rows.scales;
  const at::Tensor rhs = layer.weight.to(at::kFloat) * layer.weight_scale.view({-1, 1});
  return at::linear(lhs, rhs, bias ? bias->to(at::kFloat) : at::Tensor()).to(dtype);
}

Linear to_fp8(const Linear& layer) {
  DP_CHECK(layer.weight.dim() == 2, "an FP8 weight is a matrix, got ", layer.weight.sizes());
  if (layer.weight_scale.defined()) return layer;
  if (layer.weight.size(0) % kFp8Granularity != 0 || layer.weight.size(1) % kFp8Granularity != 0) return layer;
  const Fp8Rows quantised = quantize_rows_fp8(layer.weight);
  Linear out = layer;
  out.weight = quantised.values;
  out.weight_scale = quantised.scales.view({-1});
  return out;
}

DoubleBlock to_fp8(const DoubleBlock& block) {
  DoubleBlock out = block;
  out.attn.qkv = converted(block.attn.qkv);
  out.attn.to_out = converted(block.attn.to_out);
  out.attn.added_qkv = converted(block.attn.added_qkv);
  out.attn.to_add_out = converted(block.attn.to_add_out);
  out.ff_in = converted(block.ff_in);
  out.ff_out = converted(block.ff_out);
  out.ff_context_in = converted(block.ff_context_in);
  out.ff_context_out = converted(block.ff_context_out);
  return out;
}

SingleBlock to_fp8(const SingleBlock& block) {
  SingleBlock out = block;
  out.attn.qkv = converted(block.attn.qkv);
  out.proj_mlp = converted(block.proj_mlp);
  out.proj_out = converted(block.proj_out);
  return out;
}

}  // namespace dp::models::flux

namespace dp::models {

at::Tensor Linear::fp8_product(const at::Tensor& x) const {
  DP_CHECK(x.size(-1) == weight.size(1), "FP8 linear ", weight.sizes(), " on input ", x.sizes());
  const at::Tensor y = flux::fp8_product(flux::quantize_rows_fp8(x.reshape({-1, x.size(-1)})), *this, x.scalar_type());
  at::DimVector shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  return y.view(shape);
}

}  // namespace dp::models
