#pragma once
// The building blocks of AutoencoderKL's encoder and decoder (internal to vae.cpp and its tests). Each
// holds its weights under the checkpoint's names and runs the same ATen ops as diffusers.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "models/module_weights.h"
#include "models/vae/vae.h"

namespace dp::models {

using VaeActivation = at::Tensor (*)(const at::Tensor&);
// diffusers' get_activation names: silu/swish, mish, gelu, relu. Throws naming `source`.
VaeActivation vae_activation(const std::string& name, const std::string& source);

struct Conv2d {
  at::Tensor weight, bias;
  int64_t stride = 1, padding = 0;
  static Conv2d load(const ModuleWeights& w, const std::string& name, int64_t in, int64_t out, int64_t kernel,
                     int64_t stride, int64_t padding);
  at::Tensor operator()(const at::Tensor& x) const;
};

// On CUDA, contiguous (batch, channels, spatial...) inputs go through models/vae/cuda/group_norm_kernels.h (ATen's
// kernel reduces a group with one block: 51 ms of a FLUX decode's 91 on an H100); elsewhere through ATen.
struct GroupNorm {
  at::Tensor weight, bias;
  int64_t groups = 32;
  double eps = 1e-6;
  static GroupNorm load(const ModuleWeights& w, const std::string& name, int64_t channels, int64_t groups, double eps);
  at::Tensor operator()(const at::Tensor& x) const;
  // silu(norm(x)), rounded as the two ops round, in one pass on CUDA.
  at::Tensor with_silu(const at::Tensor& x) const;
};

// ResnetBlock2D without time embedding: norm-act-conv twice, a 1x1 shortcut when the channels change.
struct VaeResnet {
  GroupNorm norm1, norm2;
  Conv2d conv1, conv2;
  Conv2d conv_shortcut;  // undefined weight when in == out
  VaeActivation act = nullptr;
  static VaeResnet load(const ModuleWeights& w, int64_t in, int64_t out, int64_t groups, VaeActivation act);
  at::Tensor operator()(const at::Tensor& x) const;
};

// The mid block's Attention: group norm, one head over all channels, residual connection.
struct VaeAttention {
  GroupNorm group_norm;
  Linear to_q, to_k, to_v, to_out;
  static VaeAttention load(const ModuleWeights& w, int64_t channels, int64_t groups);
  at::Tensor operator()(const at::Tensor& x) const;
};

// UNetMidBlock2D: resnet, (attention), resnet.
struct VaeMidBlock {
  std::vector<VaeResnet> resnets;
  std::vector<VaeAttention> attentions;  // empty without mid_block_add_attention
  static VaeMidBlock load(const ModuleWeights& w, int64_t channels, const VaeConfig& config, VaeActivation act);
  at::Tensor operator()(const at::Tensor& x) const;
};

struct VaeDecoder {
  Conv2d conv_in;
  VaeMidBlock mid_block;
  struct UpBlock {
    std::vector<VaeResnet> resnets;
    Conv2d upsample_conv;  // undefined weight on the last block
  };
  std::vector<UpBlock> up_blocks;
  GroupNorm conv_norm_out;
  Conv2d conv_out;
  // w is scoped at "decoder".
  static VaeDecoder load(const ModuleWeights& w, const VaeConfig& config, VaeActivation act);
  at::Tensor operator()(const at::Tensor& z) const;
};

struct VaeEncoder {
  Conv2d conv_in;
  struct DownBlock {
    std::vector<VaeResnet> resnets;
    Conv2d downsample_conv;  // undefined weight on the last block
  };
  std::vector<DownBlock> down_blocks;
  VaeMidBlock mid_block;
  GroupNorm conv_norm_out;
  Conv2d conv_out;
  // w is scoped at "encoder". The output has 2 * latent_channels: mean and log-variance.
  static VaeEncoder load(const ModuleWeights& w, const VaeConfig& config, VaeActivation act);
  at::Tensor operator()(const at::Tensor& image) const;
};

}  // namespace dp::models
