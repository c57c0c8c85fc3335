#include "models/module_weights.h"

#include "core/error.h"
#include "io/torch_tensors.h"

namespace dp::models {

at::Tensor ModuleWeights::get(const std::string& name) const { return get(name, dtype_); }

at::Tensor ModuleWeights::get(const std::string& name, at::ScalarType dtype) const {
  return io::load_tensor(*index_, key(name), dtype, device_);
}

at::Tensor ModuleWeights::get_shaped(const std::string& name, at::IntArrayRef expected) const {
  const auto& info = index_->info(key(name));
  DP_CHECK(at::IntArrayRef(info.shape) == expected, index_->shard_path(key(name)), ": tensor '", key(name),
           "' has shape ", at::IntArrayRef(info.shape), " but the config implies ", expected);
  return get(name);
}

at::Tensor ModuleWeights::get_optional(const std::string& name) const {
  return has(name) ? get(name) : at::Tensor();
}

Linear Linear::load(const ModuleWeights& w, const std::string& name, int64_t in, int64_t out, bool with_bias) {
  const ModuleWeights scope = w.child(name);
  Linear layer;
  layer.weight = scope.get_shaped("weight", {out, in});
  if (with_bias) layer.bias = scope.get_shaped("bias", {out});
  return layer;
}

}  // namespace dp::models
