#pragma once
// The activation names (diffusers'/transformers' ACT2FN keys) our models implement, known without LibTorch
// so that a config naming another one is refused when it is read, before any weights load.
#include <string>
#include <vector>

namespace dp::models {

// CLIP's hidden_act and T5's dense_act_fn.
const std::vector<std::string>& text_encoder_activation_names();
// The VAE's act_fn.
const std::vector<std::string>& vae_activation_names();

// Throws "SOURCE: unsupported WHAT 'NAME' (supported: ...)" when `name` is not in `names`.
void check_activation_name(const std::string& name, const std::vector<std::string>& names,
                           const std::string& source, const std::string& what);

}  // namespace dp::models
