#pragma once
// Scoped access to a component's weights, so that a layer asks for "to_q.weight" inside its own scope and
// the lookup key is exactly the checkpoint key ("transformer_blocks.7.attn.to_q.weight").
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/parallel_load.h"
#include "io/weight_index.h"

namespace dp::models {

class LowRankAdapters;  // models/lora.h
struct LoraBinding;

class ModuleWeights {
 public:
  ModuleWeights(std::shared_ptr<const io::WeightIndex> index, at::ScalarType dtype, at::Device device,
                std::string prefix = "")
      : index_(std::move(index)), dtype_(dtype), device_(device), prefix_(std::move(prefix)) {}

  ModuleWeights child(const std::string& name) const {
    ModuleWeights out = *this;
    out.prefix_ = key(name);
    return out;
  }
  // The same scope, with the tensors `wanted` says yes to (by full key) read ahead in parallel onto the device
  // (io/parallel_load.h); get() then takes them from there instead of reading one by one. Returns the scope
  // unchanged when the load policy (io::load_policy) says to read one by one.
  ModuleWeights read_ahead(const std::function<bool(const std::string&)>& wanted = nullptr) const;
  // The same scope reading one by one: for a scope kept past loading, which must not hold read-ahead tensors.
  ModuleWeights without_read_ahead() const {
    ModuleWeights out = *this;
    out.loaded_.reset();
    return out;
  }
  // The same scope (and read-ahead tensors) giving `dtype` from get(name).
  ModuleWeights with_dtype(at::ScalarType dtype) const {
    ModuleWeights out = *this;
    out.dtype_ = dtype;
    return out;
  }
  // The same scope giving zeros of each tensor's stored shape, in the asked dtype on the device, and reading
  // nothing: a model of the checkpoint's shapes whose kernels can be warmed up while the real weights stream.
  ModuleWeights with_zeros() const {
    ModuleWeights out = without_read_ahead();
    out.zeros_ = true;
    return out;
  }
  // The same scope whose Linears get `lora`'s adapters when they load (null: none).
  ModuleWeights with_lora(std::shared_ptr<const LoraBinding> lora) const {
    ModuleWeights out = *this;
    out.lora_ = std::move(lora);
    return out;
  }
  const std::shared_ptr<const LoraBinding>& lora() const { return lora_; }
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
  std::shared_ptr<const LoraBinding> lora_;
  std::shared_ptr<io::LoadedTensors> loaded_;  // read ahead, null when reading one by one
  bool zeros_ = false;                         // with_zeros()
};

// y = x W^T + b, the nn.Linear convention; `bias` may be undefined. With unfused LoRA adapters (models/lora.h)
// their low-rank outputs are added to y.
struct Linear {
  at::Tensor weight;  // (out, in); FP8 e4m3 when weight_scale is defined
  at::Tensor bias;
  std::shared_ptr<const LowRankAdapters> adapters;
  // (out,) fp32: the per-channel scale of an FP8 weight (models/flux/fp8_gemm.h); undefined otherwise.
  at::Tensor weight_scale;
  // Loads `name`'s weight and bias, with the scope's LoRA adapters merged in or attached.
  static Linear load(const ModuleWeights& w, const std::string& name, int64_t in, int64_t out, bool with_bias = true);
  // Rows stacked in order (q, k and v as one GEMM), adapters included.
  static Linear concat(const std::vector<Linear>& parts);
  at::Tensor operator()(const at::Tensor& x) const {
    at::Tensor y = weight_scale.defined() ? fp8_product(x) : at::linear(x, weight, bias);
    if (adapters) add_adapters(y, x);
    return y;
  }
  // Every tensor (adapters' too) passed through `f`; undefined tensors stay undefined.
  Linear map(const std::function<at::Tensor(const at::Tensor&)>& f) const;
  bool defined() const { return weight.defined(); }

 private:
  void add_adapters(at::Tensor& y, const at::Tensor& x) const;
  at::Tensor fp8_product(const at::Tensor& x) const;  // models/flux/fp8_gemm.cpp
};

}  // namespace dp::models
