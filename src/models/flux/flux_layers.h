#pragma once
// Numerics shared by the FLUX blocks, each written to round exactly where diffusers rounds.
#include <ATen/ATen.h>

namespace dp::models::flux {

constexpr double kNormEps = 1e-6;

// nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6).
at::Tensor layer_norm(const at::Tensor& x);
// diffusers' RMSNorm: variance in fp32, result cast to the weight dtype for half weights, then scaled.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight);
// Sinusoidal timestep features (flip_sin_to_cos, shift 0, 256 channels), computed in fp32.
at::Tensor timestep_features(const at::Tensor& timesteps, int64_t channels = 256);
// FluxPosEmbed: cos and sin tables (S, head_dim) in fp32 for position ids (S, 3), frequencies in fp64.
struct RotaryTables {
  at::Tensor cos;
  at::Tensor sin;
};
RotaryTables rotary_tables(const at::Tensor& ids, at::IntArrayRef axes_dims, double theta = 10000.0);
// apply_rotary_emb with interleaved real/imaginary pairs on x (B, S, H, D); math in fp32.
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& rope);
// SDPA over (B, S, H, D) tensors, returning (B, S, H*D) in the input dtype.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
// x * (1 + scale[:, None]) + shift[:, None]
at::Tensor modulate(const at::Tensor& normed, const at::Tensor& shift, const at::Tensor& scale);

}  // namespace dp::models::flux
