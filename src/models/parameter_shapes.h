#pragma once
// The checkpoint keys and shapes a model reads, listed from its config without LibTorch: the fixtures write
// exactly these tensors, planning sizes modules from them, and the component check compares them with the
// safetensors headers before any weights load. Builders for the layer kinds the lists are made of.
#include <cstdint>
#include <string>
#include <vector>

namespace dp::models {

struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
};

using ParameterShapes = std::vector<ParameterShape>;

void add_parameter(ParameterShapes& out, const std::string& name, std::vector<int64_t> shape);
// nn.Linear: weight (out, in), bias (out).
void add_linear(ParameterShapes& out, const std::string& name, int64_t in, int64_t out_features, bool bias = true);
// LayerNorm and GroupNorm: weight and bias of the channel count.
void add_norm(ParameterShapes& out, const std::string& name, int64_t channels);
// nn.Conv2d with a square kernel: weight (out, in, k, k), bias (out).
void add_conv(ParameterShapes& out, const std::string& name, int64_t in, int64_t out_channels, int64_t kernel);

}  // namespace dp::models
