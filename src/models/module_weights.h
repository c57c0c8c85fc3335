#pragma once
// Scoped access to a component's weights, so that a layer asks for "to_q.weight" inside its own scope and
// the lookup key is exactly the checkpoint key ("transformer_blocks.7.attn.to_q.weight").
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "io/weight_index.h"

namespace dp::models {

class ModuleWeights {
 public:
  ModuleWeights(std::shared_ptr<const io::WeightIndex> index, at::ScalarType dtype, at::Device device,
                std::string prefix = "")
      : index_(std::move(index)), dtype_(dtype), device_(device), prefix_(std::move(prefix)) {}

  ModuleWeights child(const std::string& name) const {
    return ModuleWeights(index_, dtype_, device_, key(name));
  }
  std::string key(const std::string& name) const { return prefix_.empty() ? name : prefix_ + "." + name; }
  bool has(const std::string& name) const { return index_->contains(key(name)); }
  // The tensor converted to the run dtype on the run device; throws naming the folder and full key.
  at::Tensor get(const std::string& name) const;
  // Same, but at a dtype of the caller's choice (norm weights kept in fp32, integer tables).
  at::Tensor get(const std::string& name, at::ScalarType dtype) const;
  // Checks the stored shape before anything is converted; a wrong config gives a clear error here.
  at::Tensor get_shaped(const std::string& name, at::IntArrayRef expected) const;
  at::Tensor get_optional(const std::string& name) const;  // undefined tensor when absent

  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }
  const std::string& prefix() const { return prefix_; }
  const io::WeightIndex& index() const { return *index_; }
  const std::shared_ptr<const io::WeightIndex>& index_ptr() const { return index_; }

 private:
  std::shared_ptr<const io::WeightIndex> index_;
  at::ScalarType dtype_;
  at::Device device_;
  std::string prefix_;
};

// y = x W^T + b, the nn.Linear convention; `bias` may be undefined.
struct Linear {
  at::Tensor weight;
  at::Tensor bias;
  static Linear load(const ModuleWeights& w, const std::string& name, int64_t in, int64_t out, bool with_bias = true);
  at::Tensor operator()(const at::Tensor& x) const { return at::linear(x, weight, bias); }
  bool defined() const { return weight.defined(); }
};

}  // namespace dp::models
