#include "models/parameter_shapes.h"

#include <utility>

namespace dp::models {

void add_parameter(ParameterShapes& out, const std::string& name, std::vector<int64_t> shape) {
  out.push_back({name, std::move(shape)});
}

void add_linear(ParameterShapes& out, const std::string& name, int64_t in, int64_t out_features, bool bias) {
  add_parameter(out, name + ".weight", {out_features, in});
  if (bias) add_parameter(out, name + ".bias", {out_features});
}

void add_norm(ParameterShapes& out, const std::string& name, int64_t channels) {
  add_parameter(out, name + ".weight", {channels});
  add_parameter(out, name + ".bias", {channels});
}

void add_conv(ParameterShapes& out, const std::string& name, int64_t in, int64_t out_channels, int64_t kernel) {
  add_parameter(out, name + ".weight", {out_channels, in, kernel, kernel});
  add_parameter(out, name + ".bias", {out_channels});
}

}  // namespace dp::models
