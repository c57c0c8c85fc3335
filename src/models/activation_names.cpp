#include "models/activation_names.h"

#include <algorithm>

#include "core/error.h"

namespace dp::models {

const std::vector<std::string>& text_encoder_activation_names() {
  static const std::vector<std::string> names = {"gelu",       "gelu_new",   "gelu_pytorch_tanh",
                                                 "gelu_fast",  "quick_gelu", "relu",
                                                 "silu",       "swish",      "tanh"};
  return names;
}

const std::vector<std::string>& vae_activation_names() {
  static const std::vector<std::string> names = {"silu", "swish", "mish", "gelu", "relu"};
  return names;
}

void check_activation_name(const std::string& name, const std::vector<std::string>& names,
                           const std::string& source, const std::string& what) {
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  std::string known;
  for (const auto& n : names) known += known.empty() ? n : ", " + n;
  DP_FAIL(source, ": unsupported ", what, " '", name, "' (supported: ", known, ")");
}

}  // namespace dp::models
