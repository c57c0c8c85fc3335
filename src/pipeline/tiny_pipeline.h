#pragma once
// A complete tiny random FLUX pipeline folder in diffusers format: what `diffpipe make-tiny` writes. Every
// component FluxPipeline.from_pretrained loads is there (tokenizers included), at sizes that run in
// milliseconds on a CPU, so diffusers and diffpipe can be compared on it end to end.
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/clip_text_model.h"
#include "models/flux_config.h"
#include "models/t5_encoder.h"
#include "models/vae.h"

namespace dp::pipeline {

struct TinyPipelineOptions {
  io::DType dtype = io::DType::F32;  // stored weights: F32, BF16 or F16
  uint64_t seed = 0;                 // of the random weights; each component derives its own
};

// The architectures written, vocabulary sizes filled in from the tokenizers.
struct TinyPipelineConfigs {
  models::ClipTextConfig clip;
  models::T5Config t5;
  models::VaeConfig vae;
  models::FluxConfig transformer;
};

struct TinyPipelineReport {
  struct Part {
    std::string name;   // component folder
    uint64_t bytes = 0; // weight bytes, 0 for tokenizers and the scheduler
  };
  std::vector<Part> parts;
  TinyPipelineConfigs configs;
};

// The tiny architectures; vocab sizes are those of the tiny tokenizers.
TinyPipelineConfigs tiny_pipeline_configs(int64_t clip_vocab_size, int64_t clip_bos_id, int64_t clip_eos_id,
                                          int64_t t5_vocab_size);

// Writes model_index.json and every component folder under `out` (created; existing files are overwritten).
TinyPipelineReport write_tiny_pipeline(const std::string& out, const TinyPipelineOptions& options);

}  // namespace dp::pipeline
