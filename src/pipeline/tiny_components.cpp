#include "pipeline/tiny_components.h"

#include "core/error.h"

namespace dp::pipeline {
namespace {

using models::ParameterShape;
using Shapes = std::vector<ParameterShape>;

void add(Shapes& out, const std::string& name, std::vector<int64_t> shape) { out.push_back({name, std::move(shape)}); }

void add_linear(Shapes& out, const std::string& name, int64_t in, int64_t out_features, bool bias = true) {
  add(out, name + ".weight", {out_features, in});
  if (bias) add(out, name + ".bias", {out_features});
}

// LayerNorm and GroupNorm both store weight and bias of the channel count.
void add_norm(Shapes& out, const std::string& name, int64_t channels) {
  add(out, name + ".weight", {channels});
  add(out, name + ".bias", {channels});
}

void add_conv(Shapes& out, const std::string& name, int64_t in, int64_t out_channels, int64_t kernel) {
  add(out, name + ".weight", {out_channels, in, kernel, kernel});
  add(out, name + ".bias", {out_channels});
}

// ResnetBlock2D without time embedding; the 1x1 shortcut exists only when the channel count changes.
void add_vae_resnet(Shapes& out, const std::string& p, int64_t in, int64_t out_channels) {
  add_norm(out, p + ".norm1", in);
  add_conv(out, p + ".conv1", in, out_channels, 3);
  add_norm(out, p + ".norm2", out_channels);
  add_conv(out, p + ".conv2", out_channels, out_channels, 3);
  if (in != out_channels) add_conv(out, p + ".conv_shortcut", in, out_channels, 1);
}

void add_vae_mid_block(Shapes& out, const std::string& p, int64_t channels, bool with_attention) {
  add_vae_resnet(out, p + ".resnets.0", channels, channels);
  if (with_attention) {
    const std::string a = p + ".attentions.0";
    add_norm(out, a + ".group_norm", channels);
    for (const char* proj : {".to_q", ".to_k", ".to_v", ".to_out.0"}) add_linear(out, a + proj, channels, channels);
  }
  add_vae_resnet(out, p + ".resnets.1", channels, channels);
}

void add_vae_encoder(Shapes& out, const models::VaeConfig& c) {
  const auto& channels = c.block_out_channels;
  add_conv(out, "encoder.conv_in", c.in_channels, channels[0], 3);
  int64_t in = channels[0];
  for (size_t i = 0; i < channels.size(); ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      add_vae_resnet(out, p + ".resnets." + std::to_string(j), j == 0 ? in : channels[i], channels[i]);
    }
    if (i + 1 < channels.size()) add_conv(out, p + ".downsamplers.0.conv", channels[i], channels[i], 3);
    in = channels[i];
  }
  add_vae_mid_block(out, "encoder.mid_block", channels.back(), c.mid_block_add_attention);
  add_norm(out, "encoder.conv_norm_out", channels.back());
  add_conv(out, "encoder.conv_out", channels.back(), 2 * c.latent_channels, 3);  // mean and log-variance
}

void add_vae_decoder(Shapes& out, const models::VaeConfig& c) {
  const std::vector<int64_t> channels(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  add_conv(out, "decoder.conv_in", c.latent_channels, channels[0], 3);
  add_vae_mid_block(out, "decoder.mid_block", channels[0], c.mid_block_add_attention);
  int64_t in = channels[0];
  for (size_t i = 0; i < channels.size(); ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    // UpDecoderBlock2D holds one resnet more than layers_per_block.
    for (int64_t j = 0; j <= c.layers_per_block; ++j) {
      add_vae_resnet(out, p + ".resnets." + std::to_string(j), j == 0 ? in : channels[i], channels[i]);
    }
    if (i + 1 < channels.size()) add_conv(out, p + ".upsamplers.0.conv", channels[i], channels[i], 3);
    in = channels[i];
  }
  add_norm(out, "decoder.conv_norm_out", channels.back());
  add_conv(out, "decoder.conv_out", channels.back(), c.out_channels, 3);
}

}  // namespace

std::string torch_dtype_name(io::DType dtype) {
  switch (dtype) {
    case io::DType::F32: return "float32";
    case io::DType::BF16: return "bfloat16";
    case io::DType::F16: return "float16";
    default: DP_FAIL("generated weights must be F32, BF16 or F16, not ", io::dtype_name(dtype));
  }
}

std::vector<ParameterShape> clip_text_parameter_shapes(const models::ClipTextConfig& c) {
  const int64_t d = c.hidden_size;
  Shapes out;
  add(out, "embeddings.token_embedding.weight", {c.vocab_size, d});
  add(out, "embeddings.position_embedding.weight", {c.max_position_embeddings, d});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "encoder.layers." + std::to_string(i);
    add_norm(out, p + ".layer_norm1", d);
    for (const char* proj : {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.out_proj"}) {
      add_linear(out, p + proj, d, d);
    }
    add_norm(out, p + ".layer_norm2", d);
    add_linear(out, p + ".mlp.fc1", d, c.intermediate_size);
    add_linear(out, p + ".mlp.fc2", c.intermediate_size, d);
  }
  add_norm(out, "final_layer_norm", d);
  return out;
}

std::vector<ParameterShape> t5_encoder_parameter_shapes(const models::T5Config& c) {
  const int64_t d = c.d_model, inner = c.inner_dim();
  Shapes out;
  add(out, "shared.weight", {c.vocab_size, d});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "encoder.block." + std::to_string(i) + ".layer";
    for (const char* proj : {".0.SelfAttention.q", ".0.SelfAttention.k", ".0.SelfAttention.v"}) {
      add_linear(out, p + proj, d, inner, false);
    }
    add_linear(out, p + ".0.SelfAttention.o", inner, d, false);
    // Only block 0 owns the relative position bias; the others reuse it.
    if (i == 0) add(out, p + ".0.SelfAttention.relative_attention_bias.weight", {c.relative_attention_num_buckets, c.num_heads});
    add(out, p + ".0.layer_norm.weight", {d});
    if (c.is_gated_act) {
      add_linear(out, p + ".1.DenseReluDense.wi_0", d, c.d_ff, false);
      add_linear(out, p + ".1.DenseReluDense.wi_1", d, c.d_ff, false);
    } else {
      add_linear(out, p + ".1.DenseReluDense.wi", d, c.d_ff, false);
    }
    add_linear(out, p + ".1.DenseReluDense.wo", c.d_ff, d, false);
    add(out, p + ".1.layer_norm.weight", {d});
  }
  add(out, "encoder.final_layer_norm.weight", {d});
  return out;
}

std::vector<ParameterShape> vae_parameter_shapes(const models::VaeConfig& c) {
  DP_CHECK(!c.block_out_channels.empty(), "VAE config: block_out_channels is empty");
  Shapes out;
  add_vae_encoder(out, c);
  add_vae_decoder(out, c);
  if (c.use_quant_conv) add_conv(out, "quant_conv", 2 * c.latent_channels, 2 * c.latent_channels, 1);
  if (c.use_post_quant_conv) add_conv(out, "post_quant_conv", c.latent_channels, c.latent_channels, 1);
  return out;
}

nlohmann::json clip_text_config_json(const models::ClipTextConfig& c, const std::string& torch_dtype) {
  // Besides what CLIPTextModel reads: the fields CLIPTextConfig serialises, so transformers loads it without
  // falling back to defaults that differ from ours (projection_dim is unused by CLIPTextModel).
  return {{"architectures", {"CLIPTextModel"}},
          {"model_type", "clip_text_model"},
          {"attention_dropout", 0.0},
          {"bos_token_id", c.bos_token_id},
          {"dtype", torch_dtype},
          {"eos_token_id", c.eos_token_id},
          {"hidden_act", c.hidden_act},
          {"hidden_size", c.hidden_size},
          {"initializer_factor", 1.0},
          {"initializer_range", 0.02},
          {"intermediate_size", c.intermediate_size},
          {"layer_norm_eps", c.layer_norm_eps},
          {"max_position_embeddings", c.max_position_embeddings},
          {"num_attention_heads", c.num_attention_heads},
          {"num_hidden_layers", c.num_hidden_layers},
          {"pad_token_id", c.pad_token_id},
          {"projection_dim", c.hidden_size},
          {"transformers_version", "5.23.0"},
          {"vocab_size", c.vocab_size}};
}

nlohmann::json t5_encoder_config_json(const models::T5Config& c, const std::string& torch_dtype) {
  return {{"architectures", {"T5EncoderModel"}},
          {"model_type", "t5"},
          {"classifier_dropout", 0.0},
          {"d_ff", c.d_ff},
          {"d_kv", c.d_kv},
          {"d_model", c.d_model},
          {"decoder_start_token_id", 0},
          {"dense_act_fn", c.dense_act_fn},
          {"dropout_rate", 0.1},
          {"dtype", torch_dtype},
          {"eos_token_id", c.eos_token_id},
          {"feed_forward_proj", c.feed_forward_proj},
          {"initializer_factor", 1.0},
          {"is_decoder", false},
          {"is_encoder_decoder", false},
          {"is_gated_act", c.is_gated_act},
          {"layer_norm_epsilon", c.layer_norm_epsilon},
          {"num_decoder_layers", c.num_layers},
          {"num_heads", c.num_heads},
          {"num_layers", c.num_layers},
          {"pad_token_id", c.pad_token_id},
          {"relative_attention_max_distance", c.relative_attention_max_distance},
          {"relative_attention_num_buckets", c.relative_attention_num_buckets},
          {"scale_decoder_outputs", true},
          {"tie_word_embeddings", true},  // shared.weight is also encoder.embed_tokens.weight
          {"transformers_version", "5.23.0"},
          {"use_cache", false},
          {"vocab_size", c.vocab_size}};
}

nlohmann::json vae_config_json(const models::VaeConfig& c) {
  auto optional_list = [](const std::vector<double>& v) { return v.empty() ? nlohmann::json(nullptr) : nlohmann::json(v); };
  return {{"_class_name", "AutoencoderKL"},
          {"_diffusers_version", "0.42.1"},
          {"act_fn", c.act_fn},
          {"block_out_channels", c.block_out_channels},
          {"down_block_types", c.down_block_types},
          {"force_upcast", c.force_upcast},
          {"in_channels", c.in_channels},
          {"latent_channels", c.latent_channels},
          {"latents_mean", optional_list(c.latents_mean)},
          {"latents_std", optional_list(c.latents_std)},
          {"layers_per_block", c.layers_per_block},
          {"mid_block_add_attention", c.mid_block_add_attention},
          {"norm_num_groups", c.norm_num_groups},
          {"out_channels", c.out_channels},
          {"sample_size", c.sample_size},
          {"scaling_factor", c.scaling_factor},
          {"shift_factor", c.shift_factor ? nlohmann::json(*c.shift_factor) : nlohmann::json(nullptr)},
          {"up_block_types", c.up_block_types},
          {"use_post_quant_conv", c.use_post_quant_conv},
          {"use_quant_conv", c.use_quant_conv}};
}

nlohmann::json flux_scheduler_config_json() {
  return {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
          {"_diffusers_version", "0.42.1"},
          {"base_image_seq_len", 256},
          {"base_shift", 0.5},
          {"invert_sigmas", false},
          {"max_image_seq_len", 4096},
          {"max_shift", 1.15},
          {"num_train_timesteps", 1000},
          {"shift", 3.0},
          {"shift_terminal", nullptr},
          {"stochastic_sampling", false},
          {"time_shift_type", "exponential"},
          {"use_beta_sigmas", false},
          {"use_dynamic_shifting", true},
          {"use_exponential_sigmas", false},
          {"use_karras_sigmas", false}};
}

nlohmann::json flux_model_index_json() {
  // transformers 5 saves T5TokenizerFast under its unified name T5Tokenizer; FluxPipeline's optional IP-Adapter
  // components are written as [null, null].
  const nlohmann::json absent = nlohmann::json::array({nullptr, nullptr});
  return {{"_class_name", "FluxPipeline"},
          {"_diffusers_version", "0.42.1"},
          {"feature_extractor", absent},
          {"image_encoder", absent},
          {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
          {"text_encoder", {"transformers", "CLIPTextModel"}},
          {"text_encoder_2", {"transformers", "T5EncoderModel"}},
          {"tokenizer", {"transformers", "CLIPTokenizer"}},
          {"tokenizer_2", {"transformers", "T5Tokenizer"}},
          {"transformer", {"diffusers", "FluxTransformer2DModel"}},
          {"vae", {"diffusers", "AutoencoderKL"}}};
}

}  // namespace dp::pipeline
