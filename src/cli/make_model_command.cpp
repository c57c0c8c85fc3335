// `diffpipe make-tiny` and `diffpipe make-random`: diffusers-format folders with random weights.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/command.h"
#include "cli/format.h"
#include "core/error.h"
#include "core/log.h"
#include "io/torch_tensors.h"
#include "pipeline/random_model.h"
#include "pipeline/tiny_pipeline.h"

namespace dp::cli {
namespace {

struct MakeOptions {
  std::string out;
  std::string arch = "flux-dev";
  std::string dtype = "bf16";
  uint64_t seed = 0;
  bool force = false;
};

io::DType weights_dtype(const std::string& name) {
  return io::to_safetensors_dtype(io::parse_run_dtype(name));
}

void prepare_output(const MakeOptions& o) {
  namespace fs = std::filesystem;
  if (fs::exists(o.out)) {
    DP_CHECK(fs::is_directory(o.out), o.out, ": exists and is not a directory");
    DP_CHECK(o.force || fs::is_empty(o.out), o.out, ": directory is not empty (pass --force to write into it)");
  }
  fs::create_directories(o.out);
}

void write_model_index(const std::string& out, const std::vector<std::pair<std::string, std::string>>& parts) {
  nlohmann::json index = {{"_class_name", "FluxPipeline"}, {"_diffusers_version", "0.42.1"}};
  for (const auto& [name, cls] : parts) {
    const bool from_transformers = name.rfind("text_encoder", 0) == 0 || name.rfind("tokenizer", 0) == 0;
    index[name] = {from_transformers ? "transformers" : "diffusers", cls};
  }
  std::ofstream file(std::filesystem::path(out) / "model_index.json");
  file << index.dump(2) << "\n";
}

void make_folder(const MakeOptions& o, const models::FluxConfig& config) {
  prepare_output(o);
  const auto started = std::chrono::steady_clock::now();
  pipeline::RandomWriteOptions write;
  write.dtype = weights_dtype(o.dtype);
  write.seed = o.seed;
  const uint64_t bytes = pipeline::write_random_component(o.out, pipeline::flux_transformer_component(config), write);
  write_model_index(o.out, {{"transformer", "FluxTransformer2DModel"}});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "wrote " << o.out << ": transformer " << human_bytes(bytes) << " (" << o.dtype << ", "
            << config.num_layers << " double + " << config.num_single_layers << " single blocks, hidden "
            << config.inner_dim() << ") in " << seconds << " s\n";
}

// The whole pipeline (tokenizers, text encoders, transformer, VAE, scheduler), loadable by diffusers too.
void make_tiny_pipeline(const MakeOptions& o) {
  prepare_output(o);
  const auto started = std::chrono::steady_clock::now();
  pipeline::TinyPipelineOptions options;
  options.dtype = weights_dtype(o.dtype);
  options.seed = o.seed;
  const pipeline::TinyPipelineReport report = pipeline::write_tiny_pipeline(o.out, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  uint64_t total = 0;
  std::cout << "wrote " << o.out << " (tiny FLUX pipeline, " << o.dtype << ", seed " << o.seed << "):\n";
  for (const auto& part : report.parts) {
    std::cout << "  " << part.name;
    if (part.bytes > 0) std::cout << ": " << human_bytes(part.bytes);
    std::cout << "\n";
    total += part.bytes;
  }
  const auto& t = report.configs.transformer;
  std::cout << "  transformer: " << t.num_layers << " double + " << t.num_single_layers << " single blocks, hidden "
            << t.inner_dim() << "; CLIP vocab " << report.configs.clip.vocab_size << ", T5 vocab "
            << report.configs.t5.vocab_size << "\n";
  std::cout << "  total " << human_bytes(total) << " in " << seconds << " s\n";
}

CommandRegistrar tiny("make-tiny", 60, [](CLI::App& root) {
  auto o = std::make_shared<MakeOptions>();
  o->dtype = "fp32";
  auto* cmd = root.add_subcommand("make-tiny", "Write a complete tiny random FLUX pipeline folder in diffusers format "
                                               "(tokenizers included; the demo's and tests' model)");
  cmd->add_option("--out", o->out, "output folder (created; must be empty unless --force)")->required();
  cmd->add_option("--seed", o->seed, "seed of the random weights")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "stored dtype: fp32, bf16 or fp16")->capture_default_str();
  cmd->add_flag("--force", o->force, "write into a non-empty folder");
  cmd->callback([o] { make_tiny_pipeline(*o); });
});

CommandRegistrar random("make-random", 61, [](CLI::App& root) {
  auto o = std::make_shared<MakeOptions>();
  auto* cmd = root.add_subcommand("make-random", "Write a full-size FLUX architecture with random weights (for "
                                                 "benchmarks; FLUX.1-dev is 23.8 GB in bf16)");
  cmd->add_option("--out", o->out, "output folder (created; must be empty unless --force)")->required();
  cmd->add_option("--arch", o->arch, "flux-dev or flux-schnell")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the random weights")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "stored dtype: fp32, bf16 or fp16")->capture_default_str();
  cmd->add_flag("--force", o->force, "write into a non-empty folder");
  cmd->callback([o] {
    models::FluxConfig config = models::FluxConfig::flux_dev();
    if (o->arch == "flux-schnell") config.guidance_embeds = false;
    else DP_CHECK(o->arch == "flux-dev", "--arch: unknown architecture '", o->arch, "' (expected flux-dev or flux-schnell)");
    make_folder(*o, config);
  });
});

}  // namespace
}  // namespace dp::cli
