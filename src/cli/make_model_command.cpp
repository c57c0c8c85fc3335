// `diffpipe make-tiny` and `diffpipe make-random`: diffusers-format folders with random weights.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "cli/command.h"
#include "cli/format.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/json_file.h"
#include "core/log.h"
#include "io/run_dtype.h"
#include "fixtures/random_model.h"
#include "fixtures/random_pipeline.h"
#include "fixtures/tiny_pipeline.h"

namespace dp::cli {
namespace {

struct MakeOptions {
  std::string out;
  std::string arch = "flux-dev";
  std::string dtype = "bf16";
  uint64_t seed = 0;
  bool force = false;
  bool pipeline = false;  // make-random: the whole FluxPipeline, not only the transformer
  bool sparse = false;    // make-random: headers only, data left as holes
  int64_t attention_heads = 0;  // make-tiny: 0 keeps the tiny transformer's 2 heads
  int64_t lora_rank = 0;  // make-random: write a LoRA adapter of this rank (to --out FILE) instead of a model
};

void prepare_output(const MakeOptions& o) {
  namespace fs = std::filesystem;
  if (fs::exists(o.out)) {
    DP_CHECK(fs::is_directory(o.out), o.out, ": exists and is not a directory");
    DP_CHECK(o.force || fs::is_empty(o.out), o.out, ": directory is not empty (pass --force to write into it)");
  }
  fs::create_directories(o.out);
  mark_work_started();  // the arguments and folder are checked: a failure while writing is a runtime error (1)
}

void write_model_index(const std::string& out, const std::vector<std::pair<std::string, std::string>>& parts) {
  nlohmann::json index = {{"_class_name", "FluxPipeline"}, {"_diffusers_version", "0.42.1"}};
  for (const auto& [name, cls] : parts) {
    const bool from_transformers = name.rfind("text_encoder", 0) == 0 || name.rfind("tokenizer", 0) == 0;
    index[name] = {from_transformers ? "transformers" : "diffusers", cls};
  }
  write_json_file((std::filesystem::path(out) / "model_index.json").string(), index);
}

void make_folder(const MakeOptions& o, const models::FluxConfig& config) {
  prepare_output(o);
  const auto started = std::chrono::steady_clock::now();
  fixtures::RandomWriteOptions write;
  write.dtype = io::parse_run_dtype(o.dtype);
  write.seed = o.seed;
  write.sparse = o.sparse;
  const uint64_t bytes = fixtures::write_random_component(o.out, fixtures::flux_transformer_component(config), write);
  write_model_index(o.out, {{"transformer", "FluxTransformer2DModel"}});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "wrote " << o.out << ": transformer " << human_bytes(bytes) << " (" << o.dtype << ", "
            << config.num_layers << " double + " << config.num_single_layers << " single blocks, hidden "
            << config.inner_dim() << ") in " << seconds << " s\n";
}

// The whole pipeline at full size: each part is reported as soon as it is written (T5-XXL and the
// transformer take a while).
void make_random_pipeline(const MakeOptions& o) {
  prepare_output(o);
  const auto started = std::chrono::steady_clock::now();
  fixtures::RandomPipelineOptions options;
  options.arch = fixtures::parse_flux_arch(o.arch);
  options.dtype = io::parse_run_dtype(o.dtype);
  options.seed = o.seed;
  options.sparse = o.sparse;
  std::cout << "writing " << o.out << " (" << o.arch << " pipeline, " << o.dtype << ", seed " << o.seed
            << (o.sparse ? ", sparse: headers only" : "") << "):" << std::endl;
  uint64_t total_bytes = 0, total_parameters = 0;
  fixtures::write_random_pipeline(o.out, options, [&](const fixtures::WrittenComponent& part) {
    std::cout << "  " << std::left << std::setw(15) << part.name << std::right;
    if (part.parameters > 0) {
      std::cout << std::setw(15) << part.parameters << " parameters (" << human_count(part.parameters) << "), "
                << human_bytes(part.bytes) << ", " << std::fixed << std::setprecision(1) << part.seconds << " s";
      if (!o.sparse && part.seconds > 0) std::cout << " (" << human_bytes(part.bytes / part.seconds) << "/s)";
    }
    std::cout << std::endl;
    total_bytes += part.bytes;
    total_parameters += part.parameters;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "  total " << total_parameters << " parameters (" << human_count(total_parameters) << "), "
            << human_bytes(total_bytes) << " in " << std::fixed << std::setprecision(1) << seconds << " s\n";
}

// The whole pipeline (tokenizers, text encoders, transformer, VAE, scheduler), loadable by diffusers too.
void make_tiny_pipeline(const MakeOptions& o) {
  prepare_output(o);
  const auto started = std::chrono::steady_clock::now();
  fixtures::TinyPipelineOptions options;
  options.dtype = io::parse_run_dtype(o.dtype);
  options.seed = o.seed;
  options.attention_heads = o.attention_heads;
  const fixtures::TinyPipelineReport report = fixtures::write_tiny_pipeline(o.out, options);
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
            << t.inner_dim() << " (" << t.num_attention_heads << " heads); CLIP vocab " << report.configs.clip.vocab_size << ", T5 vocab "
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
  cmd->add_option("--attention-heads", o->attention_heads,
                  "the transformer's heads: N heads of 8 channels (hidden 8N), e.g. 12 for --sequence-parallel 2, 3, "
                  "4 or 6; default 2 heads of 16");
  cmd->add_flag("--force", o->force, "write into a non-empty folder");
  cmd->callback([o] { make_tiny_pipeline(*o); });
});

CommandRegistrar random("make-random", 61, [](CLI::App& root) {
  auto o = std::make_shared<MakeOptions>();
  auto* cmd = root.add_subcommand("make-random", "Write a full-size FLUX architecture with random weights (for "
                                                 "benchmarks; FLUX.1-dev is 23.8 GB in bf16)");
  cmd->add_option("--out", o->out, "output folder (created; must be empty unless --force)")->required();
  cmd->add_option("--arch", o->arch, "flux-dev or flux-schnell (no guidance embedding)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the random weights")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "stored dtype: fp32, bf16 or fp16")->capture_default_str();
  cmd->add_flag("--force", o->force, "write into a non-empty folder");
  cmd->add_flag("--pipeline", o->pipeline,
                "the whole FluxPipeline at full size: CLIP ViT-L/14 text encoder, T5 v1.1 XXL encoder, transformer, "
                "VAE, scheduler and make-tiny's tokenizers (33.7 GB in bf16)");
  cmd->add_flag("--sparse", o->sparse,
                "write safetensors headers only and leave the data as holes (instant; for plan/inspect tests, "
                "weights read as zeros)");
  cmd->add_option("--lora-rank", o->lora_rank,
                  "write a random LoRA adapter of this rank for every Linear of the arch's transformer to --out "
                  "(a .safetensors file; diffusers/PEFT layout, rank 64 for FLUX.1-dev: 0.69 GB in bf16)");
  cmd->callback([o] {
    const fixtures::FluxArch arch = fixtures::parse_flux_arch(o->arch);
    if (o->lora_rank > 0) {
      models::FluxConfig config = models::FluxConfig::flux_dev();
      config.guidance_embeds = arch == fixtures::FluxArch::dev;
      fixtures::RandomWriteOptions write;
      write.dtype = io::parse_run_dtype(o->dtype);
      write.seed = o->seed;
      write.sparse = o->sparse;
      const auto started = std::chrono::steady_clock::now();
      mark_work_started();
      const uint64_t bytes = fixtures::write_random_lora(o->out, config, o->lora_rank, write);
      std::cout << "wrote " << o->out << ": rank-" << o->lora_rank << " LoRA, " << human_bytes(bytes) << " ("
                << o->dtype << ") in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
                << " s\n";
      return;
    }
    if (o->pipeline) return make_random_pipeline(*o);
    models::FluxConfig config = models::FluxConfig::flux_dev();
    config.guidance_embeds = arch == fixtures::FluxArch::dev;
    make_folder(*o, config);
  });
});

}  // namespace
}  // namespace dp::cli
