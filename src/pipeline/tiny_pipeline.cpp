#include "pipeline/tiny_pipeline.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "pipeline/random_model.h"
#include "pipeline/tiny_components.h"

namespace fs = std::filesystem;

namespace dp::pipeline {
namespace {

void write_json(const fs::path& path, const nlohmann::json& doc) { write_json_file(path.string(), doc); }

}  // namespace

TinyPipelineConfigs tiny_pipeline_configs(int64_t clip_vocab_size, int64_t clip_bos_id, int64_t clip_eos_id,
                                          int64_t t5_vocab_size) {
  TinyPipelineConfigs c;
  c.clip.vocab_size = clip_vocab_size;
  c.clip.hidden_size = 32;
  c.clip.intermediate_size = 37;
  c.clip.num_hidden_layers = 2;
  c.clip.num_attention_heads = 4;
  c.clip.max_position_embeddings = 77;
  c.clip.bos_token_id = clip_bos_id;
  // The real eos id (not FLUX.1-dev's legacy 2), so pooling picks the first eos like current transformers.
  c.clip.eos_token_id = clip_eos_id;
  c.clip.pad_token_id = clip_eos_id;

  c.t5.vocab_size = t5_vocab_size;
  c.t5.d_model = 32;
  c.t5.d_kv = 8;
  c.t5.d_ff = 37;
  c.t5.num_layers = 2;
  c.t5.num_heads = 4;
  c.t5.relative_attention_num_buckets = 8;
  c.t5.relative_attention_max_distance = 16;
  c.t5.feed_forward_proj = "gated-gelu";  // T5 v1.1, as FLUX's encoder
  c.t5.dense_act_fn = "gelu_new";
  c.t5.is_gated_act = true;

  c.vae.in_channels = 3;
  c.vae.out_channels = 3;
  c.vae.latent_channels = 16;
  c.vae.block_out_channels = {16, 16, 32, 32};  // four levels: FLUX's 8x spatial scale
  c.vae.down_block_types.assign(4, "DownEncoderBlock2D");
  c.vae.up_block_types.assign(4, "UpDecoderBlock2D");
  c.vae.layers_per_block = 1;
  c.vae.norm_num_groups = 8;
  c.vae.scaling_factor = 0.3611;
  c.vae.shift_factor = 0.1159;
  c.vae.use_quant_conv = false;  // FLUX's VAE has neither quant convolution
  c.vae.use_post_quant_conv = false;

  c.transformer = tiny_flux_config();
  c.transformer.joint_attention_dim = c.t5.d_model;
  c.transformer.pooled_projection_dim = c.clip.hidden_size;
  return c;
}

TinyPipelineReport write_tiny_pipeline(const std::string& out, const TinyPipelineOptions& options) {
  const fs::path root(out);
  fs::create_directories(root);
  const std::string torch_dtype = torch_dtype_name(options.dtype);
  TinyPipelineReport report;

  // Tokenizers first: their vocabularies size the text encoders' embeddings.
  const TinyTokenizerInfo clip_tokens = write_tiny_clip_tokenizer((root / "tokenizer").string());
  report.parts.push_back({"tokenizer", 0});
  const TinyTokenizerInfo t5_tokens = write_tiny_t5_tokenizer((root / "tokenizer_2").string());
  report.parts.push_back({"tokenizer_2", 0});
  report.configs = tiny_pipeline_configs(clip_tokens.vocab_size, clip_tokens.bos_id, clip_tokens.eos_id,
                                         t5_tokens.vocab_size);
  const TinyPipelineConfigs& c = report.configs;

  fs::create_directories(root / "scheduler");
  write_json(root / "scheduler" / "scheduler_config.json", flux_scheduler_config_json());
  report.parts.push_back({"scheduler", 0});

  nlohmann::json transformer_config = c.transformer.to_json();
  transformer_config["_diffusers_version"] = "0.42.1";
  const std::vector<RandomComponent> components = {
      {"text_encoder", "config.json", clip_text_config_json(c.clip, torch_dtype), clip_text_parameter_shapes(c.clip),
       "model"},
      {"text_encoder_2", "config.json", t5_encoder_config_json(c.t5, torch_dtype), t5_encoder_parameter_shapes(c.t5),
       "model"},
      {"transformer", "config.json", transformer_config, models::flux_parameter_shapes(c.transformer),
       "diffusion_pytorch_model"},
      {"vae", "config.json", vae_config_json(c.vae), vae_parameter_shapes(c.vae), "diffusion_pytorch_model"},
  };
  for (size_t i = 0; i < components.size(); ++i) {
    RandomWriteOptions write;
    write.dtype = options.dtype;
    // Distinct streams per component, so equal key names in two models do not get equal values.
    write.seed = options.seed * 0x9E3779B97F4A7C15ULL + i;
    write.threads = 1;  // the tensors are tiny
    report.parts.push_back({components[i].name, write_random_component(out, components[i], write)});
  }
  write_json(root / "model_index.json", flux_model_index_json());
  DP_INFO("wrote tiny FLUX pipeline to ", out);
  return report;
}

}  // namespace dp::pipeline
