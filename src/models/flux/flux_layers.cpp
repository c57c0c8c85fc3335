#include "models/flux/flux_layers.h"

#include <cmath>

#include "core/error.h"

namespace dp::models::flux {

at::Tensor layer_norm(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, {}, {}, kNormEps); }

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) {
  const at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor normed = x * at::rsqrt(variance + kNormEps);
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) normed = normed.to(weight.scalar_type());
  return normed * weight;
}

at::Tensor timestep_features(const at::Tensor& timesteps, int64_t channels) {
  const int64_t half = channels / 2;
  const at::Tensor exponent =
      at::arange(0, half, at::TensorOptions().dtype(at::kFloat).device(timesteps.device())) *
      static_cast<float>(-std::log(10000.0)) / static_cast<float>(half);
  const at::Tensor args = timesteps.unsqueeze(1).to(at::kFloat) * at::exp(exponent).unsqueeze(0);
  // flip_sin_to_cos: cosines first.
  return at::cat({at::cos(args), at::sin(args)}, -1);
}

RotaryTables rotary_tables(const at::Tensor& ids, at::IntArrayRef axes_dims, double theta) {
  DP_CHECK(ids.dim() == 2 && ids.size(1) == static_cast<int64_t>(axes_dims.size()), "position ids must be (S, ",
           axes_dims.size(), "), got ", ids.sizes());
  const at::Tensor pos = ids.to(at::kFloat).to(at::kDouble);
  std::vector<at::Tensor> cos_parts, sin_parts;
  for (size_t axis = 0; axis < axes_dims.size(); ++axis) {
    const int64_t dim = axes_dims[axis];
    const auto options = at::TensorOptions().dtype(at::kDouble).device(ids.device());
    const at::Tensor freqs = 1.0 / at::pow(theta, at::arange(0, dim, 2, options).slice(0, 0, dim / 2) / dim);
    const at::Tensor angles = at::outer(pos.select(1, static_cast<int64_t>(axis)), freqs);
    cos_parts.push_back(angles.cos().repeat_interleave(2, 1).to(at::kFloat));
    sin_parts.push_back(angles.sin().repeat_interleave(2, 1).to(at::kFloat));
  }
  return {at::cat(cos_parts, -1), at::cat(sin_parts, -1)};
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& rope) {
  const at::Tensor cos = rope.cos.unsqueeze(0).unsqueeze(2);  // (1, S, 1, D)
  const at::Tensor sin = rope.sin.unsqueeze(0).unsqueeze(2);
  std::vector<int64_t> pair_shape(x.sizes().begin(), x.sizes().end() - 1);
  pair_shape.push_back(-1);
  pair_shape.push_back(2);
  const at::Tensor pairs = x.reshape(pair_shape);
  const at::Tensor real = pairs.select(-1, 0);
  const at::Tensor imag = pairs.select(-1, 1);
  const at::Tensor rotated = at::stack({-imag, real}, -1).flatten(3);
  return (x.to(at::kFloat) * cos + rotated.to(at::kFloat) * sin).to(x.scalar_type());
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const at::Tensor out = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
  return out.transpose(1, 2).flatten(2, 3).to(q.scalar_type());
}

at::Tensor modulate(const at::Tensor& normed, const at::Tensor& shift, const at::Tensor& scale) {
  return normed * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

}  // namespace dp::models::flux
