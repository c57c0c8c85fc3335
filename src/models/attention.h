#pragma once
// Scaled dot-product attention for the text encoders and the VAE, on (batch, heads, tokens, head_dim) tensors.
//
// Why not at::scaled_dot_product_attention alone: on Hopper it picks cuDNN, whose first call builds a graph
// per shape and per thread (60-120 ms each on an H100, bench/first_use.py, 2026-12-05), and CLIP, T5 and the
// VAE each run one shape once per image. Flash and memory-efficient attention load their kernels once per
// process, so a warm-up on any thread serves the real call. The FLUX transformer keeps the default (cuDNN is
// its fastest backend at 4608 tokens, and the loop's thread warms it before step 1).
#include <ATen/ATen.h>

#include <optional>

namespace dp::models {

// softmax(q k^T * scale + bias) v, causal when asked (top-left aligned; q and k have the same length then).
// scale defaults to 1/sqrt(head_dim). bias broadcasts to (batch, heads, q tokens, k tokens). On the CPU,
// and for inputs neither flash nor memory-efficient attention takes, this is at::scaled_dot_product_attention.
at::Tensor encoder_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& bias = std::nullopt, bool causal = false,
                             std::optional<double> scale = std::nullopt);

// Which backend encoder_attention takes for these inputs: "flash", "efficient" or "default"; for tests and logs.
const char* encoder_attention_backend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const std::optional<at::Tensor>& bias);

}  // namespace dp::models
