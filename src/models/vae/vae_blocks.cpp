#include "models/vae/vae_blocks.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "models/vae/cuda/group_norm_kernels.h"
#endif

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "models/activation_names.h"
#include "models/attention.h"
#include "models/flux/flux_fused.h"

namespace dp::models {
namespace {

// Every norm in the encoder and decoder uses diffusers' resnet_eps.
constexpr double kVaeNormEps = 1e-6;

at::Tensor silu(const at::Tensor& x) { return at::silu(x); }
at::Tensor mish(const at::Tensor& x) { return at::mish(x); }
at::Tensor gelu(const at::Tensor& x) { return at::gelu(x); }
at::Tensor relu(const at::Tensor& x) { return at::relu(x); }

}  // namespace

VaeActivation vae_activation(const std::string& name, const std::string& source) {
  check_activation_name(name, vae_activation_names(), source, "act_fn");
  if (name == "silu" || name == "swish") return silu;
  if (name == "mish") return mish;
  if (name == "gelu") return gelu;
  if (name == "relu") return relu;
  DP_FAIL(source, ": act_fn '", name, "' is listed in activation_names.cpp but has no implementation");
}

Conv2d Conv2d::load(const ModuleWeights& w, const std::string& name, int64_t in, int64_t out, int64_t kernel,
                    int64_t stride, int64_t padding) {
  const ModuleWeights scope = w.child(name);
  return {scope.get_shaped("weight", {out, in, kernel, kernel}), scope.get_shaped("bias", {out}), stride, padding};
}

at::Tensor Conv2d::operator()(const at::Tensor& x) const {
  return at::conv2d(x, weight, bias, {stride, stride}, {padding, padding});
}

GroupNorm GroupNorm::load(const ModuleWeights& w, const std::string& name, int64_t channels, int64_t groups,
                          double eps) {
  const ModuleWeights scope = w.child(name);
  return {scope.get_shaped("weight", {channels}), scope.get_shaped("bias", {channels}), groups, eps};
}

namespace {

// The kernels' GroupNorm(+SiLU) when they can run it, else an undefined tensor.
at::Tensor group_norm_on_cuda(const GroupNorm& norm, const at::Tensor& x, bool silu) {
#ifdef DIFFPIPE_HAVE_CUDA
  const auto type = x.scalar_type();
  if (!x.is_cuda() || !flux::fused_kernels_enabled() || x.dim() < 2 || !x.is_contiguous() ||
      !(type == at::kFloat || type == at::kHalf || type == at::kBFloat16) || !norm.weight.defined() ||
      !norm.bias.defined() || norm.weight.scalar_type() != type || norm.bias.scalar_type() != type ||
      norm.groups <= 0 || x.size(1) % norm.groups != 0)
    return {};  // LibTorch's kernel takes mixed dtypes with its own rules: left to it
  DP_CHECK(norm.weight.numel() == x.size(1) && norm.bias.numel() == x.size(1), "group norm of ", x.size(1),
           " channels has ", norm.weight.numel(), " weights and ", norm.bias.numel(), " biases");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor weight = norm.weight.to(x.device()).contiguous();
  const at::Tensor bias = norm.bias.to(x.device()).contiguous();
  const vae::kernels::GroupNormShape shape{x.size(0), x.size(1), x.numel() / std::max<int64_t>(1, x.size(0) * x.size(1)),
                                           norm.groups};
  const auto element = type == at::kFloat  ? vae::kernels::ElementType::F32
                       : type == at::kHalf ? vae::kernels::ElementType::F16
                                           : vae::kernels::ElementType::BF16;
  at::Tensor workspace = at::empty({vae::kernels::group_norm_workspace_floats(element, shape)},
                                   x.options().dtype(at::kFloat));
  at::Tensor out = at::empty_like(x);
  vae::kernels::group_norm(element, x.data_ptr(), weight.data_ptr(), bias.data_ptr(), shape,
                           static_cast<float>(norm.eps), silu, workspace.data_ptr<float>(), out.data_ptr(),
                           c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  const cudaError_t status = cudaGetLastError();
  DP_CHECK(status == cudaSuccess, "CUDA kernel group_norm failed to launch: ", cudaGetErrorString(status));
  return out;
#else
  (void)norm, (void)x, (void)silu;
  return {};
#endif
}

}  // namespace

at::Tensor GroupNorm::operator()(const at::Tensor& x) const {
  if (at::Tensor out = group_norm_on_cuda(*this, x, false); out.defined()) return out;
  return at::group_norm(x, groups, weight, bias, eps);
}

at::Tensor GroupNorm::with_silu(const at::Tensor& x) const {
  if (at::Tensor out = group_norm_on_cuda(*this, x, true); out.defined()) return out;
  return at::silu(at::group_norm(x, groups, weight, bias, eps));
}

VaeResnet VaeResnet::load(const ModuleWeights& w, int64_t in, int64_t out, int64_t groups, VaeActivation act) {
  VaeResnet block;
  block.norm1 = GroupNorm::load(w, "norm1", in, groups, kVaeNormEps);
  block.conv1 = Conv2d::load(w, "conv1", in, out, 3, 1, 1);
  block.norm2 = GroupNorm::load(w, "norm2", out, groups, kVaeNormEps);
  block.conv2 = Conv2d::load(w, "conv2", out, out, 3, 1, 1);
  if (in != out) block.conv_shortcut = Conv2d::load(w, "conv_shortcut", in, out, 1, 1, 0);
  block.act = act;
  return block;
}

at::Tensor VaeResnet::operator()(const at::Tensor& x) const {
  const auto norm_act = [&](const GroupNorm& norm, const at::Tensor& t) {
    return act == &silu ? norm.with_silu(t) : act(norm(t));
  };
  at::Tensor hidden = conv1(norm_act(norm1, x));
  hidden = conv2(norm_act(norm2, hidden));
  const at::Tensor shortcut = conv_shortcut.weight.defined() ? conv_shortcut(x) : x;
  return shortcut + hidden;  // output_scale_factor is 1 in the VAE: the reference's division is exact
}

VaeAttention VaeAttention::load(const ModuleWeights& w, int64_t channels, int64_t groups) {
  VaeAttention attention;
  attention.group_norm = GroupNorm::load(w, "group_norm", channels, groups, kVaeNormEps);
  attention.to_q = Linear::load(w, "to_q", channels, channels);
  attention.to_k = Linear::load(w, "to_k", channels, channels);
  attention.to_v = Linear::load(w, "to_v", channels, channels);
  attention.to_out = Linear::load(w, "to_out.0", channels, channels);
  return attention;
}

at::Tensor VaeAttention::operator()(const at::Tensor& x) const {
  const int64_t batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  // The layout steps mirror AttnProcessor2_0 so the kernels see the same strides.
  at::Tensor tokens = x.view({batch, channels, height * width}).transpose(1, 2);
  tokens = group_norm(tokens.transpose(1, 2)).transpose(1, 2);
  auto one_head = [&](const at::Tensor& t) { return t.view({batch, -1, 1, channels}).transpose(1, 2); };
  const at::Tensor q = one_head(to_q(tokens));
  const at::Tensor k = one_head(to_k(tokens));
  const at::Tensor v = one_head(to_v(tokens));
  at::Tensor attended = encoder_attention(q, k, v).transpose(1, 2).reshape({batch, -1, channels});
  attended = to_out(attended.to(q.scalar_type()));
  return attended.transpose(-1, -2).reshape({batch, channels, height, width}) + x;
}

VaeMidBlock VaeMidBlock::load(const ModuleWeights& w, int64_t channels, const VaeConfig& config, VaeActivation act) {
  VaeMidBlock block;
  const ModuleWeights resnets = w.child("resnets");
  for (int i = 0; i < 2; ++i) {
    block.resnets.push_back(VaeResnet::load(resnets.child(std::to_string(i)), channels, channels,
                                            config.norm_num_groups, act));
  }
  if (config.mid_block_add_attention) {
    block.attentions.push_back(VaeAttention::load(w.child("attentions.0"), channels, config.norm_num_groups));
  }
  return block;
}

at::Tensor VaeMidBlock::operator()(const at::Tensor& x) const {
  at::Tensor hidden = resnets[0](x);
  if (!attentions.empty()) hidden = attentions[0](hidden);
  return resnets[1](hidden);
}

VaeDecoder VaeDecoder::load(const ModuleWeights& w, const VaeConfig& c, VaeActivation act) {
  const std::vector<int64_t> channels(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  VaeDecoder decoder;
  decoder.conv_in = Conv2d::load(w, "conv_in", c.latent_channels, channels[0], 3, 1, 1);
  decoder.mid_block = VaeMidBlock::load(w.child("mid_block"), channels[0], c, act);
  int64_t in = channels[0];
  for (std::size_t i = 0; i < channels.size(); ++i) {
    const ModuleWeights block_weights = w.child("up_blocks." + std::to_string(i));
    UpBlock block;
    // UpDecoderBlock2D has one resnet more than the encoder's blocks.
    for (int64_t j = 0; j < c.layers_per_block + 1; ++j) {
      block.resnets.push_back(VaeResnet::load(block_weights.child("resnets." + std::to_string(j)),
                                              j == 0 ? in : channels[i], channels[i], c.norm_num_groups, act));
    }
    if (i + 1 < channels.size()) {
      block.upsample_conv = Conv2d::load(block_weights, "upsamplers.0.conv", channels[i], channels[i], 3, 1, 1);
    }
    decoder.up_blocks.push_back(std::move(block));
    in = channels[i];
  }
  decoder.conv_norm_out = GroupNorm::load(w, "conv_norm_out", channels.back(), c.norm_num_groups, kVaeNormEps);
  decoder.conv_out = Conv2d::load(w, "conv_out", channels.back(), c.out_channels, 3, 1, 1);
  return decoder;
}

at::Tensor VaeDecoder::operator()(const at::Tensor& z) const {
  at::Tensor hidden = mid_block(conv_in(z));
  for (const UpBlock& block : up_blocks) {
    for (const VaeResnet& resnet : block.resnets) hidden = resnet(hidden);
    if (block.upsample_conv.weight.defined()) {
      // F.interpolate(scale_factor=2.0, mode="nearest") passes the scale factors, not an output size.
      const std::vector<double> scale = {2.0, 2.0};
      hidden = block.upsample_conv(at::upsample_nearest2d(hidden, std::nullopt, scale));
    }
  }
  return conv_out(conv_norm_out.with_silu(hidden));  // conv_act is SiLU whatever act_fn says
}

VaeEncoder VaeEncoder::load(const ModuleWeights& w, const VaeConfig& c, VaeActivation act) {
  const std::vector<int64_t>& channels = c.block_out_channels;
  VaeEncoder encoder;
  encoder.conv_in = Conv2d::load(w, "conv_in", c.in_channels, channels[0], 3, 1, 1);
  int64_t in = channels[0];
  for (std::size_t i = 0; i < channels.size(); ++i) {
    const ModuleWeights block_weights = w.child("down_blocks." + std::to_string(i));
    DownBlock block;
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      block.resnets.push_back(VaeResnet::load(block_weights.child("resnets." + std::to_string(j)),
                                              j == 0 ? in : channels[i], channels[i], c.norm_num_groups, act));
    }
    if (i + 1 < channels.size()) {
      block.downsample_conv = Conv2d::load(block_weights, "downsamplers.0.conv", channels[i], channels[i], 3, 2, 0);
    }
    encoder.down_blocks.push_back(std::move(block));
    in = channels[i];
  }
  encoder.mid_block = VaeMidBlock::load(w.child("mid_block"), channels.back(), c, act);
  encoder.conv_norm_out = GroupNorm::load(w, "conv_norm_out", channels.back(), c.norm_num_groups, kVaeNormEps);
  encoder.conv_out = Conv2d::load(w, "conv_out", channels.back(), 2 * c.latent_channels, 3, 1, 1);
  return encoder;
}

at::Tensor VaeEncoder::operator()(const at::Tensor& image) const {
  at::Tensor hidden = conv_in(image);
  for (const DownBlock& block : down_blocks) {
    for (const VaeResnet& resnet : block.resnets) hidden = resnet(hidden);
    // Downsample2D with padding 0 pads right and bottom only, then a stride-2 3x3 convolution.
    if (block.downsample_conv.weight.defined()) hidden = block.downsample_conv(at::constant_pad_nd(hidden, {0, 1, 0, 1}, 0));
  }
  hidden = mid_block(hidden);
  return conv_out(conv_norm_out.with_silu(hidden));
}

}  // namespace dp::models
