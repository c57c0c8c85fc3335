#pragma once
// generate's options: what the command line (and a --config, whose keys are these flags) fills in, and the
// CLI11 definitions with their help text. The checks live in generate_checks.h, the run in generate_command.cpp.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "cli/generate_inputs.h"
#include "runtime/distributed_generate.h"

namespace dp::cli {

struct GenerateOptions {
  std::string config;  // --config FILE: its keys are already flags here (run_config.h); kept for messages
  int ranks = 0;       // the world size the run needs; 0: any
  std::string model, prompts_file, report_json, output_type = "png", device = "auto";
  std::string out;    // default: out.png, or out.h5 for --output-type latent
  std::string dtype;  // default: fp32 on cpu, bf16 on cuda
  std::vector<std::string> prompts;
  std::vector<std::string> stray_words;  // words on the command line that no option took
  int num_images_per_prompt = 1, steps = 28, max_sequence_length = 512;
  int64_t height = 0, width = 0;  // 0: the model's default size
  double guidance = 3.5;
  uint64_t seed = 0;
  runtime::RuntimeOptions runtime;
  GenerateInputs inputs;  // --lora, --negative-prompt, --true-cfg-scale, --sigmas, --latents
  std::string resume;  // --resume FILE|DIR
  bool no_warm_up = false;
  std::string revision;  // --revision: of a --model given as a Hugging Face id
  bool dry_run = false;  // --dry-run: the checks that need no device, then exit
  // The run options given on the command line (as compare_runs names them): --resume takes the others from
  // the checkpoint.
  std::vector<std::string> given;
  bool was_given(const std::string& field) const { return std::find(given.begin(), given.end(), field) != given.end(); }
};

// Adds generate's options, their help text and the footer to `cmd`, bound to `o`.
void add_generate_options(CLI::App& cmd, GenerateOptions& o);

}  // namespace dp::cli
