#include "pipeline/random_pipeline.h"

#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "pipeline/tiny_components.h"

namespace fs = std::filesystem;

namespace dp::pipeline {
namespace {

void write_json(const fs::path& path, const nlohmann::json& doc) { write_json_file(path.string(), doc); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

FluxArch parse_flux_arch(const std::string& name) {
  if (name == "flux-dev") return FluxArch::dev;
  if (name == "flux-schnell") return FluxArch::schnell;
  DP_FAIL("--arch: unknown architecture '", name, "' (expected flux-dev or flux-schnell)");
}

TinyPipelineConfigs full_size_pipeline_configs(FluxArch arch) {
  TinyPipelineConfigs c;
  c.clip = models::ClipTextConfig::clip_vit_l14();
  c.t5 = models::T5Config::t5_v1_1_xxl();
  c.vae = models::VaeConfig::flux();
  c.transformer = models::FluxConfig::flux_dev();
  c.transformer.guidance_embeds = arch == FluxArch::dev;
  DP_CHECK(c.transformer.joint_attention_dim == c.t5.d_model && c.transformer.pooled_projection_dim == c.clip.hidden_size,
           "full-size configs disagree: joint_attention_dim ", c.transformer.joint_attention_dim, " vs T5 d_model ",
           c.t5.d_model, ", pooled_projection_dim ", c.transformer.pooled_projection_dim, " vs CLIP hidden ",
           c.clip.hidden_size);
  return c;
}

std::vector<RandomComponent> pipeline_components(const TinyPipelineConfigs& c, const std::string& torch_dtype) {
  nlohmann::json transformer_config = c.transformer.to_json();
  transformer_config["_diffusers_version"] = "0.42.1";
  return {
      {"text_encoder", "config.json", clip_text_config_json(c.clip, torch_dtype), clip_text_parameter_shapes(c.clip),
       "model"},
      {"text_encoder_2", "config.json", t5_encoder_config_json(c.t5, torch_dtype), t5_encoder_parameter_shapes(c.t5),
       "model"},
      {"transformer", "config.json", transformer_config, models::flux_parameter_shapes(c.transformer),
       "diffusion_pytorch_model"},
      {"vae", "config.json", vae_config_json(c.vae), vae_parameter_shapes(c.vae), "diffusion_pytorch_model"},
  };
}

nlohmann::json flux_scheduler_config_json(FluxArch arch) {
  nlohmann::json config = flux_scheduler_config_json();
  if (arch == FluxArch::schnell) {
    config["shift"] = 1.0;
    config["use_dynamic_shifting"] = false;
  }
  return config;
}

uint64_t parameter_count(const std::vector<models::ParameterShape>& shapes) {
  uint64_t total = 0;
  for (const auto& p : shapes) {
    uint64_t numel = 1;
    for (int64_t d : p.shape) numel *= static_cast<uint64_t>(d);
    total += numel;
  }
  return total;
}

RandomPipelineReport write_random_pipeline(const std::string& out, const RandomPipelineOptions& options,
                                           const std::function<void(const WrittenComponent&)>& on_written) {
  const fs::path root(out);
  fs::create_directories(root);
  RandomPipelineReport report;
  auto record = [&](WrittenComponent part) {
    report.parts.push_back(part);
    if (on_written) on_written(part);
  };

  auto started = std::chrono::steady_clock::now();
  const TinyTokenizerInfo clip_tokens = write_tiny_clip_tokenizer((root / "tokenizer").string());
  record({"tokenizer", 0, 0, seconds_since(started)});
  started = std::chrono::steady_clock::now();
  const TinyTokenizerInfo t5_tokens = write_tiny_t5_tokenizer((root / "tokenizer_2").string());
  record({"tokenizer_2", 0, 0, seconds_since(started)});

  report.configs = full_size_pipeline_configs(options.arch);
  TinyPipelineConfigs& c = report.configs;
  // The tiny CLIP tokenizer's ids, as make-tiny sets them: transformers pools at the first eos, which then
  // is the tokenizer's <|endoftext|>.
  c.clip.bos_token_id = clip_tokens.bos_id;
  c.clip.eos_token_id = clip_tokens.eos_id;
  c.clip.pad_token_id = clip_tokens.eos_id;
  DP_CHECK(clip_tokens.vocab_size <= c.clip.vocab_size && t5_tokens.vocab_size <= c.t5.vocab_size,
           "tiny tokenizers (CLIP ", clip_tokens.vocab_size, ", T5 ", t5_tokens.vocab_size,
           " ids) exceed the encoders' vocabularies (", c.clip.vocab_size, ", ", c.t5.vocab_size, ")");
  DP_CHECK(t5_tokens.pad_id == c.t5.pad_token_id && t5_tokens.eos_id == c.t5.eos_token_id,
           "tiny T5 tokenizer ids (pad ", t5_tokens.pad_id, ", eos ", t5_tokens.eos_id, ") differ from T5's (pad ",
           c.t5.pad_token_id, ", eos ", c.t5.eos_token_id, ")");

  fs::create_directories(root / "scheduler");
  write_json(root / "scheduler" / "scheduler_config.json", flux_scheduler_config_json(options.arch));
  record({"scheduler", 0, 0, 0});

  const auto components = pipeline_components(c, torch_dtype_name(options.dtype));
  for (size_t i = 0; i < components.size(); ++i) {
    RandomWriteOptions write;
    write.dtype = options.dtype;
    write.seed = options.seed * 0x9E3779B97F4A7C15ULL + i;  // a distinct stream per component, as make-tiny
    write.threads = options.threads;
    write.sparse = options.sparse;
    started = std::chrono::steady_clock::now();
    const uint64_t bytes = write_random_component(out, components[i], write);
    record({components[i].name, parameter_count(components[i].parameters), bytes, seconds_since(started)});
  }
  write_json(root / "model_index.json", flux_model_index_json());
  DP_INFO("wrote full-size FLUX pipeline to ", out, options.sparse ? " (sparse: headers only)" : "");
  return report;
}

}  // namespace dp::pipeline
