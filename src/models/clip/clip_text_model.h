#pragma once
// transformers' CLIPTextModel (FLUX's text_encoder): token + position embeddings, pre-norm encoder layers with
// causal self-attention, a final layer norm, and the hidden state at the eos position as pooled output.
#include <ATen/ATen.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/module_weights.h"
#include "models/text_encoder_activations.h"

#include "models/clip/clip_config.h"
#include "models/lora.h"

namespace dp::models {


class ClipTextModel {
 public:
  // Reads component_dir/config.json and the weights in component_dir, converted once to dtype on device.
  // Accepts both checkpoint layouts: keys under "text_model." (transformers 4.x, FLUX.1-dev) and without it
  // (transformers 5.x save_pretrained).
  // With `lora`, the adapters' text-encoder modules are merged or attached (models/lora.h).
  static ClipTextModel load(const std::string& component_dir, at::ScalarType dtype, at::Device device,
                            std::shared_ptr<const LoraSet> lora = nullptr);
  // Unfused LoRA: which adapter choice of the LoRA set each row of the next forward uses.
  void select_adapters(const std::vector<int64_t>& choice_per_row) const;

  struct Output {
    at::Tensor last_hidden_state;  // (B, S, hidden), after the final layer norm
    at::Tensor pooled_output;      // (B, hidden), last_hidden_state at the eos position of each row
  };
  // input_ids: integer (B, S) with S <= max_position_embeddings, on any device. No padding mask is applied:
  // FluxPipeline passes none, so padded positions attend causally like any other token.
  Output forward(const at::Tensor& input_ids) const;
  // Runs the forward once on one layer of zero weights at (batch, max_position_embeddings), so that a later real
  // forward finds its kernels loaded and its handles made (the first forward on CUDA pays for both). Returns the
  // seconds it took, device work included.
  static double warm_up(const ClipTextConfig& config, at::ScalarType dtype, at::Device device, int64_t batch);
  // An upper bound on the device bytes warm_up holds at once, counted as T5Encoder::warm_up_bytes counts.
  static int64_t warm_up_bytes(const ClipTextConfig& config, at::ScalarType dtype, int64_t batch);

  const ClipTextConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

 private:
  struct LayerNorm {
    at::Tensor weight, bias;
    double eps = 1e-5;
    static LayerNorm load(const ModuleWeights& w, const std::string& name, int64_t dim, double eps);
    at::Tensor operator()(const at::Tensor& x) const;
  };
  struct EncoderLayer {
    LayerNorm layer_norm1, layer_norm2;
    Linear q_proj, k_proj, v_proj, out_proj;
    Linear fc1, fc2;
  };

  ClipTextModel() = default;
  at::Tensor encoder_layer(const EncoderLayer& layer, const at::Tensor& hidden) const;
  at::Tensor eos_positions(const at::Tensor& input_ids) const;

  ClipTextConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  Activation activation_ = nullptr;
  at::Tensor token_embedding_, position_embedding_;
  std::vector<EncoderLayer> layers_;
  LayerNorm final_layer_norm_;
  std::shared_ptr<const LoraBinding> lora_;
};

}  // namespace dp::models
