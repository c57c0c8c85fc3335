#include "models/text_encoder_activations.h"

#include <cmath>
#include <utility>

#include "core/error.h"
#include "models/activation_names.h"

namespace dp::models {
namespace {

at::Tensor gelu_erf(const at::Tensor& x) { return at::gelu(x); }
at::Tensor gelu_tanh(const at::Tensor& x) { return at::gelu(x, "tanh"); }

// transformers' NewGELUActivation ("gelu_new", T5 v1.1): the tanh approximation spelled out op by op, not
// at::gelu(x, "tanh"), whose fused kernel rounds differently in half precision.
at::Tensor gelu_new(const at::Tensor& x) {
  const double sqrt_2_over_pi = std::sqrt(2.0 / M_PI);
  const at::Tensor inner = (x + at::pow(x, 3.0) * 0.044715) * sqrt_2_over_pi;
  return (x * 0.5) * (at::tanh(inner) + 1.0);
}

// FastGELUActivation ("gelu_fast").
at::Tensor gelu_fast(const at::Tensor& x) {
  return (x * 0.5) * (at::tanh((x * 0.7978845608) * ((x * 0.044715) * x + 1.0)) + 1.0);
}

// QuickGELUActivation ("quick_gelu", OpenAI CLIP).
at::Tensor quick_gelu(const at::Tensor& x) { return x * at::sigmoid(x * 1.702); }

at::Tensor relu(const at::Tensor& x) { return at::relu(x); }
at::Tensor silu(const at::Tensor& x) { return at::silu(x); }
at::Tensor tanh_activation(const at::Tensor& x) { return at::tanh(x); }

}  // namespace

Activation text_encoder_activation(const std::string& name, const std::string& source) {
  check_activation_name(name, text_encoder_activation_names(), source, "activation");
  static const std::pair<const char*, Activation> table[] = {
      {"gelu", gelu_erf},       {"gelu_new", gelu_new}, {"gelu_pytorch_tanh", gelu_tanh},
      {"gelu_fast", gelu_fast}, {"quick_gelu", quick_gelu}, {"relu", relu},
      {"silu", silu},           {"swish", silu},          {"tanh", tanh_activation}};
  for (const auto& [key, fn] : table) {
    if (name == key) return fn;
  }
  DP_FAIL(source, ": activation '", name, "' is listed in activation_names.cpp but has no implementation");
}

}  // namespace dp::models
