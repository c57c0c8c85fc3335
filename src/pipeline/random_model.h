#pragma once
// Writes diffusers-format folders with random weights: the demo's tiny model, test fixtures and full-size
// FLUX.1-dev checkpoints for benchmarks (no download needed).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/flux_config.h"

namespace dp::pipeline {

struct RandomComponent {
  std::string name;          // folder name, e.g. "transformer"
  std::string config_file;   // "config.json"
  nlohmann::json config;
  std::vector<models::ParameterShape> parameters;
  std::string weights_stem;  // "diffusion_pytorch_model" or "model"
};

struct RandomWriteOptions {
  io::DType dtype = io::DType::F32;
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 10'000'000'000;  // diffusers' default shard size is 10 GB for transformers
  unsigned threads = 0;                        // 0: hardware concurrency
  // Headers only: the data region is left as a hole (full-size folders for planning and CLI tests, written
  // in milliseconds; loaders read zeros).
  bool sparse = false;
};

// Writes dir/<name>/{config, weights}. Weights get uniform values scaled by 1/sqrt(fan_in); 1-D "weight"
// tensors of norms are ones. Returns the bytes written.
uint64_t write_random_component(const std::string& root, const RandomComponent& component,
                                const RandomWriteOptions& options);

RandomComponent flux_transformer_component(const models::FluxConfig& config);

// A small FLUX config for the demo and tests: every code path of FLUX.1-dev at a size that runs in
// milliseconds on a CPU.
models::FluxConfig tiny_flux_config();

}  // namespace dp::pipeline
