#pragma once
// A complete FluxPipeline folder at FLUX.1-dev's (or FLUX.1-schnell's) published sizes with random weights:
// what `diffpipe make-random --pipeline` writes for whole-pipeline benchmarks, since no real weights can be
// downloaded. The tokenizers are make-tiny's (real vocabulary files cannot be built offline); the text
// encoders keep their full vocabularies, so their embedding tables are larger than the tokenizers need.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "pipeline/random_model.h"
#include "pipeline/tiny_pipeline.h"

namespace dp::pipeline {

enum class FluxArch { dev, schnell };
// "flux-dev" or "flux-schnell"; anything else throws naming the value.
FluxArch parse_flux_arch(const std::string& name);

// CLIP ViT-L/14 text, T5 v1.1 XXL encoder, FLUX's AutoencoderKL and the FLUX transformer (guidance
// embedding for dev only), with the presets' own token ids.
TinyPipelineConfigs full_size_pipeline_configs(FluxArch arch);

// The four weight components of `configs`, in the order written: text_encoder, text_encoder_2, transformer,
// vae. torch_dtype is the name the text encoders' config.json records ("bfloat16", ...).
std::vector<RandomComponent> pipeline_components(const TinyPipelineConfigs& configs, const std::string& torch_dtype);

// dev: FLUX.1-dev's dynamic-shift scheduler (as make-tiny writes it); schnell: static shift 1.0, no dynamic
// shifting, as FLUX.1-schnell's scheduler_config.json.
nlohmann::json flux_scheduler_config_json(FluxArch arch);

uint64_t parameter_count(const std::vector<models::ParameterShape>& shapes);

struct RandomPipelineOptions {
  FluxArch arch = FluxArch::dev;
  io::DType dtype = io::DType::BF16;
  uint64_t seed = 0;
  bool sparse = false;   // headers only (see RandomWriteOptions::sparse)
  unsigned threads = 0;  // 0: hardware concurrency
};

struct WrittenComponent {
  std::string name;
  uint64_t parameters = 0;  // 0 for tokenizers and the scheduler
  uint64_t bytes = 0;
  double seconds = 0;
};

struct RandomPipelineReport {
  std::vector<WrittenComponent> parts;
  TinyPipelineConfigs configs;  // as written: CLIP's token ids are the tiny tokenizer's
};

// Writes every folder FluxPipeline.from_pretrained loads under `out` (created; files are overwritten);
// model_index.json comes last, so a folder holding it is complete. on_written is called after each part.
RandomPipelineReport write_random_pipeline(const std::string& out, const RandomPipelineOptions& options,
                                           const std::function<void(const WrittenComponent&)>& on_written = {});

}  // namespace dp::pipeline
