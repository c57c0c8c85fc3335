#pragma once
// The activation functions that transformers' text encoders name in config.json (ACT2FN keys), each written
// as the same sequence of ATen ops as the reference, so that bf16/fp16 rounding matches step for step.
#include <ATen/ATen.h>

#include <string>

namespace dp::models {

using Activation = at::Tensor (*)(const at::Tensor&);

// Throws naming `source` (the config file) and the supported names when `name` is unknown.
Activation text_encoder_activation(const std::string& name, const std::string& source);

}  // namespace dp::models
