#include "models/attention.h"

#include <atomic>

#include "core/log.h"

namespace dp::models {
namespace {

bool half_precision(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// What both fused backends need: one dtype, 4-d inputs with unit stride along head_dim, the same batch, heads
// and head_dim everywhere, keys and values of one length, and square scores when causal.
bool fused_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!q.is_cuda() || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) return false;
  for (int d : {0, 1, 3})
    if (k.size(d) != q.size(d) || v.size(d) != q.size(d)) return false;
  if (k.size(2) != v.size(2) || q.size(2) == 0 || k.size(2) == 0) return false;
  return q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1;
}

// k and v match q's dtype and head_dim (fused_shapes), so q says it all.
bool flash_takes(const at::Tensor& q, const std::optional<at::Tensor>& bias) {
  const int64_t head_dim = q.size(3);
  return !bias && half_precision(q.scalar_type()) && head_dim % 8 == 0 && head_dim <= 256;
}

bool efficient_takes(const at::Tensor& q, const std::optional<at::Tensor>& bias) {
  const at::ScalarType t = q.scalar_type();
  if (!half_precision(t) && t != at::kFloat) return false;
  // Rows of 16 bytes: the kernel's vectorised loads.
  const int64_t alignment = 16 / static_cast<int64_t>(c10::elementSize(t));
  return q.size(3) % alignment == 0 && (!bias || (bias->defined() && bias->dim() <= 4));
}

// The memory-efficient kernel reads the bias with rows aligned to 16 elements, in q's dtype, at the full
// (batch, heads, q tokens, k tokens) shape (broadcast dimensions keep a zero stride).
at::Tensor aligned_bias(const at::Tensor& bias, const at::Tensor& q, const at::Tensor& k) {
  constexpr int64_t kRowAlignment = 16;
  const int64_t keys = k.size(2);
  at::Tensor b = bias.to(q.scalar_type());
  while (b.dim() < 4) b = b.unsqueeze(0);
  if (b.stride(3) != 1 || keys % kRowAlignment != 0 || b.stride(2) % kRowAlignment != 0) {
    std::vector<int64_t> padded_shape(b.sizes().begin(), b.sizes().end());
    padded_shape[3] = (keys + kRowAlignment - 1) / kRowAlignment * kRowAlignment;
    at::Tensor padded = at::zeros(padded_shape, b.options());
    padded.narrow(3, 0, keys).copy_(b);
    b = padded.narrow(3, 0, keys);
  }
  return b.expand({q.size(0), q.size(1), q.size(2), keys});
}

enum class Backend { flash, efficient, fallback };

Backend choose_backend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& bias) {
  if (!fused_shapes(q, k, v)) return Backend::fallback;
  if (flash_takes(q, bias)) return Backend::flash;
  if (efficient_takes(q, bias)) return Backend::efficient;
  return Backend::fallback;
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::flash: return "flash";
    case Backend::efficient: return "efficient";
    case Backend::fallback: break;
  }
  return "default";
}

at::Tensor default_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& bias, bool causal, std::optional<double> scale) {
  return at::scaled_dot_product_attention(q, k, v, bias, 0.0, causal, scale);
}

}  // namespace

const char* encoder_attention_backend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const std::optional<at::Tensor>& bias) {
  return backend_name(choose_backend(q, k, v, bias));
}

at::Tensor encoder_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& bias, bool causal, std::optional<double> scale) {
  const std::optional<at::Tensor> mask = bias && bias->defined() ? bias : std::nullopt;
  const Backend backend = choose_backend(q, k, v, mask);
  if (backend == Backend::fallback || (causal && q.size(2) != k.size(2)))
    return default_attention(q, k, v, mask, causal, scale);
  try {
    if (backend == Backend::flash)
      return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, 0.0, causal, false, scale));
    const std::optional<at::Tensor> aligned = mask ? std::optional<at::Tensor>(aligned_bias(*mask, q, k)) : std::nullopt;
    return std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, v, aligned, false, 0.0, causal, scale));
  } catch (const c10::Error& e) {
    // A build or device without the fused kernel: the default is the same arithmetic, with its first-use cost.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      DP_WARN("attention: ", backend_name(backend), " attention refused ", q.sizes(), " ", q.scalar_type(), " (",
              e.what_without_backtrace(), "); using LibTorch's default backend");
    return default_attention(q, k, v, mask, causal, scale);
  }
}

}  // namespace dp::models
