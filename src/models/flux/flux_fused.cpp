#include "models/flux/flux_fused.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "models/flux/cuda/cublaslt_matmul.h"
#include "models/flux/cuda/flux_fused_kernels.h"
#include "models/flux/cuda/modulation_rows.h"
#endif

namespace dp::models::flux {
namespace {

std::atomic<int>& fused_setting() {
  static std::atomic<int> setting = [] {
    const char* value = std::getenv("DIFFPIPE_FUSED_KERNELS");
    return (value != nullptr && std::strcmp(value, "0") == 0) ? 0 : 1;
  }();
  return setting;
}

// Off: on an H100 the table took 1.1-1.6 ms off the steady step and the kernel matches cuBLAS for a step's row, but
// step 1, which builds the table, was 1.13-1.22x a later step, against the 1.1x (bench/RESULTS.md,
// session 23).
constexpr bool kModulationTableByDefault = false;

// DIFFPIPE_MODULATION_TABLE: 1 on, 0 off, -1 (unset or anything else) the default.
int modulation_table_from_environment() {
  const char* value = std::getenv("DIFFPIPE_MODULATION_TABLE");
  if (value == nullptr) return -1;
  return std::strcmp(value, "1") == 0 ? 1 : std::strcmp(value, "0") == 0 ? 0 : -1;
}

std::atomic<int>& modulation_table_setting() {
  static std::atomic<int> setting{modulation_table_from_environment()};
  return setting;
}

at::Tensor heads_view(const at::Tensor& x, int64_t head_dim) { return x.unflatten(-1, {-1, head_dim}); }

void check_rows(const at::Tensor& t, const char* what) {
  DP_CHECK(t.dim() == 3, what, " must be (batch, tokens, features), got ", t.sizes());
  DP_CHECK(t.stride(2) == 1, what, " needs a contiguous last dimension, got strides ", t.strides());
}

void check_modulation(const at::Tensor& m, const at::Tensor& x, const char* what) {
  DP_CHECK(m.dim() == 2 && m.size(0) == x.size(0) && m.size(1) == x.size(2), what, " must be (", x.size(0), ", ",
           x.size(2), ") for input ", x.sizes(), ", got ", m.sizes());
  DP_CHECK(m.scalar_type() == x.scalar_type() && m.device() == x.device(), what, " is ", m.scalar_type(), " on ",
           m.device(), " but the input is ", x.scalar_type(), " on ", x.device());
}

#ifdef DIFFPIPE_HAVE_CUDA
bool use_kernels(const at::Tensor& x) {
  const auto type = x.scalar_type();
  return x.is_cuda() && fused_kernels_enabled() &&
         (type == at::kFloat || type == at::kHalf || type == at::kBFloat16);
}

kernels::ElementType element_type(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kFloat: return kernels::ElementType::F32;
    case at::kHalf: return kernels::ElementType::F16;
    case at::kBFloat16: return kernels::ElementType::BF16;
    default: DP_FAIL("no fused kernel for dtype ", x.scalar_type());
  }
}

kernels::RowView rows_of(const at::Tensor& t) {
  return {const_cast<void*>(t.data_ptr()), t.stride(0), t.stride(1)};
}

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  DP_CHECK(status == cudaSuccess, "CUDA kernel ", kernel, " failed to launch: ", cudaGetErrorString(status));
}

cudaStream_t current_stream(const at::Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.get_device()).stream(); }
#else
bool use_kernels(const at::Tensor&) { return false; }
#endif

}  // namespace

bool fused_kernels_enabled() { return fused_setting().load() != 0; }
void set_fused_kernels_enabled(bool enabled) { fused_setting().store(enabled ? 1 : 0); }

AttentionInputs empty_attention_inputs(int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim,
                                       const at::TensorOptions& options) {
  return {at::empty({batch, tokens, heads, head_dim}, options), at::empty({batch, tokens, heads, head_dim}, options),
          at::empty({batch, tokens, heads, head_dim}, options)};
}

void fill_attention_inputs(const at::Tensor& qkv, const at::Tensor& norm_q, const at::Tensor& norm_k,
                           const RotaryTables& rope, int64_t token_offset, AttentionInputs& out) {
  check_rows(qkv, "qkv projection");
  const int64_t batch = out.q.size(0), total = out.q.size(1), heads = out.q.size(2), head_dim = out.q.size(3);
  const int64_t tokens = qkv.size(1);
  DP_CHECK(qkv.size(0) == batch && qkv.size(2) >= 3 * heads * head_dim, "qkv projection ", qkv.sizes(),
           " does not hold q, k and v for ", batch, " x ", heads, " heads of ", head_dim);
  DP_CHECK(token_offset >= 0 && token_offset + tokens <= total, "tokens [", token_offset, ", ", token_offset + tokens,
           ") fall outside the ", total, " attention rows");
  DP_CHECK(rope.cos.size(0) == total && rope.cos.size(1) == head_dim, "rotary tables are ", rope.cos.sizes(),
           " but attention has ", total, " rows of ", head_dim);
  DP_CHECK(norm_q.numel() == head_dim && norm_k.numel() == head_dim, "q/k norm weights must hold ", head_dim,
           " values, got ", norm_q.numel(), " and ", norm_k.numel());
  for (const at::Tensor* t : {&out.q, &out.k, &out.v}) {
    DP_CHECK(t->is_contiguous() && t->sizes() == out.q.sizes() && t->scalar_type() == qkv.scalar_type(),
             "attention inputs must be contiguous ", out.q.sizes(), " ", qkv.scalar_type(), ", got ", t->sizes(), " ",
             t->scalar_type());
  }
  const int64_t width = heads * head_dim;
#ifdef DIFFPIPE_HAVE_CUDA
  const auto pair_bytes = static_cast<int64_t>(2 * qkv.element_size());
  if (use_kernels(qkv) && head_dim % 2 == 0 && head_dim <= 256 && qkv.stride(0) % 2 == 0 && qkv.stride(1) % 2 == 0 &&
      reinterpret_cast<uintptr_t>(qkv.data_ptr()) % pair_bytes == 0) {
    const c10::cuda::CUDAGuard guard(qkv.device());
    const at::Tensor cos = rope.cos.to(qkv.device(), at::kFloat).contiguous();
    const at::Tensor sin = rope.sin.to(qkv.device(), at::kFloat).contiguous();
    const at::Tensor wq = norm_q.to(qkv.scalar_type()).contiguous(), wk = norm_k.to(qkv.scalar_type()).contiguous();
    const kernels::QkvLayout layout{batch, tokens, heads, head_dim, total, token_offset};
    kernels::qk_norm_rope(element_type(qkv), rows_of(qkv), wq.data_ptr(), wk.data_ptr(), cos.data_ptr<float>(),
                          sin.data_ptr<float>(), static_cast<float>(kNormEps), layout, out.q.data_ptr(),
                          out.k.data_ptr(), out.v.data_ptr(), current_stream(qkv));
    check_launch("qk_norm_rope");
    return;
  }
#endif
  const RotaryTables rows{rope.cos.slice(0, token_offset, token_offset + tokens),
                          rope.sin.slice(0, token_offset, token_offset + tokens)};
  const auto part = [&](int64_t index) { return heads_view(qkv.narrow(-1, index * width, width), head_dim); };
  out.q.narrow(1, token_offset, tokens).copy_(apply_rotary(rms_norm(part(0), norm_q), rows));
  out.k.narrow(1, token_offset, tokens).copy_(apply_rotary(rms_norm(part(1), norm_k), rows));
  out.v.narrow(1, token_offset, tokens).copy_(part(2));
}

at::Tensor layer_norm_modulate(const at::Tensor& x_in, const at::Tensor& shift, const at::Tensor& scale) {
  DP_CHECK(x_in.dim() == 3, "layer_norm_modulate input must be (batch, tokens, dim), got ", x_in.sizes());
  check_modulation(shift, x_in, "shift");
  check_modulation(scale, x_in, "scale");
#ifdef DIFFPIPE_HAVE_CUDA
  if (use_kernels(x_in) && shift.stride(1) == 1 && scale.stride(1) == 1 && shift.stride(0) == scale.stride(0)) {
    const c10::cuda::CUDAGuard guard(x_in.device());
    const at::Tensor x = x_in.contiguous();
    at::Tensor out = at::empty_like(x);
    kernels::layer_norm_modulate(element_type(x), x.data_ptr(), shift.data_ptr(), scale.data_ptr(), shift.stride(0),
                                 x.size(0), x.size(1), x.size(2), static_cast<float>(kNormEps), out.data_ptr(),
                                 current_stream(x));
    check_launch("layer_norm_modulate");
    return out;
  }
#endif
  return modulate(layer_norm(x_in), shift, scale);
}

at::Tensor add_gated(const at::Tensor& x_in, const at::Tensor& gate, const at::Tensor& y_in) {
  DP_CHECK(x_in.dim() == 3 && x_in.sizes() == y_in.sizes(), "add_gated needs two equal (batch, tokens, dim) shapes, got ",
           x_in.sizes(), " and ", y_in.sizes());
  check_modulation(gate, x_in, "gate");
#ifdef DIFFPIPE_HAVE_CUDA
  if (use_kernels(x_in) && y_in.scalar_type() == x_in.scalar_type() && gate.stride(1) == 1) {
    const c10::cuda::CUDAGuard guard(x_in.device());
    const at::Tensor x = x_in.contiguous(), y = y_in.contiguous();
    at::Tensor out = at::empty_like(x);
    kernels::add_gated(element_type(x), x.data_ptr(), gate.data_ptr(), gate.stride(0), y.data_ptr(), x.size(0),
                       x.size(1), x.size(2), out.data_ptr(), current_stream(x));
    check_launch("add_gated");
    return out;
  }
#endif
  return x_in + gate.unsqueeze(1) * y_in;
}

void gelu_tanh_into(const at::Tensor& src, const at::Tensor& dst) {
  check_rows(src, "gelu input");
  check_rows(dst, "gelu output");
  DP_CHECK(src.sizes() == dst.sizes() && src.scalar_type() == dst.scalar_type(), "gelu input ", src.sizes(), " ",
           src.scalar_type(), " and output ", dst.sizes(), " ", dst.scalar_type(), " differ");
#ifdef DIFFPIPE_HAVE_CUDA
  if (use_kernels(src) && dst.device() == src.device()) {
    const c10::cuda::CUDAGuard guard(src.device());
    kernels::gelu_tanh(element_type(src), rows_of(src), rows_of(dst), src.size(0), src.size(1), src.size(2),
                       current_stream(src));
    check_launch("gelu_tanh");
    return;
  }
#endif
  dst.copy_(at::gelu(src, "tanh"));
}

void linear_gelu_tanh_into(const at::Tensor& x, const Linear& layer, const at::Tensor& out) {
  check_rows(x, "linear input");
  check_rows(out, "gelu output");
  DP_CHECK(layer.weight.dim() == 2 && x.size(2) == layer.weight.size(1) && out.size(0) == x.size(0) &&
               out.size(1) == x.size(1) && out.size(2) == layer.weight.size(0),
           "linear ", layer.weight.sizes(), " on input ", x.sizes(), " does not give output ", out.sizes());
#ifdef DIFFPIPE_HAVE_CUDA
  // Unfused LoRA adapters add to the linear's output before the GELU: no epilogue for those; nor for FP8
  // weights, whose GEMM (layer's own) rounds its output before the GELU kernel reads it.
  if (use_kernels(x) && layer.bias.defined() && !layer.adapters && !layer.weight_scale.defined() && x.is_contiguous() &&
      out.scalar_type() == x.scalar_type() && out.device() == x.device()) {
    const c10::cuda::CUDAGuard guard(x.device());
    // view, not reshape: the GEMM must write into `out` itself, never into a copy of it.
    const cublaslt::LinearProblem problem(x.view({-1, x.size(2)}), layer.weight, layer.bias,
                                          out.view({-1, out.size(2)}), cublaslt::Epilogue::kGeluBias);
    if (cublaslt::run_with_heuristic(problem)) return;
  }
#endif
  gelu_tanh_into(layer(x), out);
}

at::Tensor linear_gelu_tanh(const at::Tensor& x, const Linear& layer) {
  const at::Tensor out = at::empty({x.size(0), x.size(1), layer.weight.size(0)}, x.options());
  linear_gelu_tanh_into(x, layer, out);
  return out;
}

bool modulation_table_enabled(const at::Device& device) {
  const int setting = modulation_table_setting().load();
  if (setting >= 0) return setting == 1;
  return kModulationTableByDefault && device.is_cuda() && fused_kernels_enabled();
}

void set_modulation_table_override(std::optional<bool> enabled) {
  modulation_table_setting().store(enabled.has_value() ? (*enabled ? 1 : 0) : modulation_table_from_environment());
}

at::Tensor modulation_rows(const Linear& layer, const at::Tensor& act, int64_t group_rows) {
  DP_CHECK(act.dim() == 2 && layer.weight.dim() == 2 && act.size(1) == layer.weight.size(1), "modulation projection ",
           layer.weight.sizes(), " on input ", act.sizes());
  DP_CHECK(group_rows >= 0 && (group_rows == 0 || act.size(0) % group_rows == 0), "modulation rows in groups of ",
           group_rows, " for ", act.size(0), " rows");
#ifdef DIFFPIPE_HAVE_CUDA
  if (use_kernels(act) && modulation_table_enabled(act.device()) && !layer.adapters && !layer.weight_scale.defined() &&
      layer.weight.is_contiguous() && layer.weight.scalar_type() == act.scalar_type() &&
      layer.weight.device() == act.device() &&
      (!layer.bias.defined() || (layer.bias.scalar_type() == act.scalar_type() && layer.bias.is_contiguous()))) {
    const c10::cuda::CUDAGuard guard(act.device());
    const at::Tensor x = act.contiguous();
    at::Tensor out = at::empty({x.size(0), layer.weight.size(0)}, x.options());
    kernels::modulation_rows(element_type(x), x.data_ptr(), layer.weight.data_ptr(),
                             layer.bias.defined() ? layer.bias.data_ptr() : nullptr, x.size(0), layer.weight.size(0),
                             x.size(1), out.data_ptr(), current_stream(x));
    check_launch("modulation_rows");
    return out;
  }
#endif
  if (group_rows == 0 || group_rows == act.size(0)) return layer(act);
  std::vector<at::Tensor> groups;
  for (int64_t first = 0; first < act.size(0); first += group_rows)
    groups.push_back(layer(act.narrow(0, first, group_rows).clone()));
  return at::cat(groups, 0);
}

}  // namespace dp::models::flux
