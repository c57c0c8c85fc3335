#pragma once
// transformers' T5EncoderModel (FLUX's text_encoder_2): shared token embedding, pre-norm blocks of
// self-attention with a relative position bias (computed by block 0, shared by all) and a feed-forward
// layer (plain or gated), RMS-style layer norms, no attention scaling.
#include <ATen/ATen.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/module_weights.h"
#include "models/text_encoder_activations.h"

#include "models/t5/t5_config.h"

namespace dp::models {


class T5Encoder {
 public:
  // Reads component_dir/config.json and the weights, converted once to dtype on device. The token
  // embedding is "shared.weight" (tied to "encoder.embed_tokens.weight", either may be stored). With fp16,
  // the feed-forward output projections ("wo") stay fp32 as transformers' _keep_in_fp32_modules does.
  static T5Encoder load(const std::string& component_dir, at::ScalarType dtype, at::Device device);

  // Runs the forward code once, with one block of zero weights at `config`'s sizes, on a (batch, seq) input:
  // the kernels, cuBLAS handles and lazily loaded CUDA modules the real forward needs are ready afterwards, so
  // that running this while the weights stream takes T5's first-use cost off the encode. Holds one block's
  // weights (about 0.4 GB for T5-XXL in bf16) while it runs. Returns the seconds it took.
  static double warm_up(const T5Config& config, at::ScalarType dtype, at::Device device, int64_t batch, int64_t seq);
  // An upper bound on the device bytes warm_up holds at once: its block of zero weights and a forward's
  // activations counted at 4 bytes an element, the attention scores twice, plus the libraries' workspaces and
  // small tensors (models/warm_up_allowance.h). A memory cap admits the warm-up beside the weights only with
  // this much room (runtime/components.h).
  static int64_t warm_up_bytes(const T5Config& config, at::ScalarType dtype, int64_t batch, int64_t seq);

  // input_ids: integer (B, S) on any device. Returns last_hidden_state (B, S, d_model) in the run dtype.
  // No attention mask, as FluxPipeline calls the encoder: padding tokens are attended to.
  at::Tensor forward(const at::Tensor& input_ids) const;

  // Bucket index of every (query, key) pair, (S, S) int64 on `device`: the bidirectional T5 scheme, exact
  // buckets for small distances and logarithmic ones up to max_distance. Public for tests.
  at::Tensor relative_position_buckets(int64_t seq_len, at::Device device) const;

  const T5Config& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

 private:
  struct LayerNorm {
    at::Tensor weight;
    double eps = 1e-6;
    at::Tensor operator()(const at::Tensor& x) const;
  };
  struct Block {
    LayerNorm attention_norm;
    Linear q, k, v, o;
    LayerNorm ff_norm;
    Linear wi, wi_0, wi_1, wo;  // wi for the plain feed-forward, wi_0/wi_1 for the gated one
  };

  T5Encoder() = default;
  at::Tensor block_forward(const Block& block, const at::Tensor& hidden, const at::Tensor& position_bias) const;
  at::Tensor feed_forward(const Block& block, const at::Tensor& normed) const;

  T5Config config_;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  Activation activation_ = nullptr;
  at::Tensor embed_tokens_;
  at::Tensor relative_attention_bias_;  // (buckets, heads), block 0's
  std::vector<Block> blocks_;
  LayerNorm final_layer_norm_;
};

}  // namespace dp::models
