#include "models/module_weights.h"

#include "core/error.h"
#include "io/torch_tensors.h"
#include "models/lora.h"

namespace dp::models {

at::Tensor ModuleWeights::get(const std::string& name) const { return get(name, dtype_); }

at::Tensor ModuleWeights::get(const std::string& name, at::ScalarType dtype) const {
  if (zeros_) return at::zeros(index_->info(key(name)).shape, at::TensorOptions().dtype(dtype).device(device_));
  if (loaded_) {
    at::Tensor tensor = loaded_->take(key(name), dtype);
    if (tensor.defined()) return tensor;
  }
  return io::load_tensor(*index_, key(name), dtype, device_);
}

ModuleWeights ModuleWeights::read_ahead(const std::function<bool(const std::string&)>& wanted) const {
  const io::LoadPolicy policy = io::load_policy();
  if (!policy.read_ahead || zeros_) return *this;
  std::vector<std::string> names;
  for (const auto& name : index_->names()) {
    if (!prefix_.empty() && name.compare(0, prefix_.size() + 1, prefix_ + ".") != 0) continue;
    if (wanted && !wanted(name)) continue;
    // Held in the file's dtype until taken: under a memory cap, a tensor stored wider than the run dtype is read
    // one by one instead, converted on the host, so the device never holds the wide copy of a whole component.
    if (policy.bounded_memory && io::dtype_size(index_->info(name).dtype) > at::elementSize(dtype_)) continue;
    names.push_back(name);
  }
  if (names.empty()) return *this;
  ModuleWeights out = *this;
  out.loaded_ = io::load_parallel(*index_, names, device_);
  return out;
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
  if (w.lora()) w.lora()->apply(scope.prefix(), layer);
  return layer;
}

Linear Linear::concat(const std::vector<Linear>& parts) {
  std::vector<at::Tensor> weights, biases;
  std::vector<const Linear*> pointers;
  for (const auto& p : parts) {
    DP_CHECK(!p.weight_scale.defined(), "FP8 layers are not concatenated: concatenate, then quantise");
    weights.push_back(p.weight);
    biases.push_back(p.bias);
    pointers.push_back(&p);
  }
  return {at::cat(weights, 0), at::cat(biases, 0), LowRankAdapters::concat(pointers), at::Tensor()};
}

Linear Linear::map(const std::function<at::Tensor(const at::Tensor&)>& f) const {
  const auto mapped = [&](const at::Tensor& t) { return t.defined() ? f(t) : t; };
  return {mapped(weight), mapped(bias), adapters ? adapters->map(f) : nullptr, mapped(weight_scale)};
}

void Linear::add_adapters(at::Tensor& y, const at::Tensor& x) const { adapters->add_to(y, x); }

}  // namespace dp::models
