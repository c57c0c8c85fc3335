#pragma once
// generate's inputs beyond the prompts, as FluxPipeline takes them: LoRA adapters (load_lora_weights +
// set_adapters), true classifier-free guidance (negative_prompt + true_cfg_scale), custom sigmas and initial
// latents. Their flags, their cheap checks (before the model folder is opened), and the reads that need the
// model's configs (adapter files fitted to the transformer and CLIP, the latents file).
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "io/checkpoint_file.h"
#include "pipeline/flux_pipeline.h"

namespace dp::cli {

struct GenerateInputs {
  std::vector<std::string> lora;  // [NAME=]FILE[:SCALE] each
  std::string lora_mode = "fused";
  std::vector<std::string> negative_prompts;
  double true_cfg_scale = 1.0;
  std::vector<double> sigmas;
  std::string latents;  // HDF5 file
};

// Adds --lora, --lora-mode, --negative-prompt, --true-cfg-scale, --sigmas and --latents to generate.
void add_generate_input_options(CLI::App& command, GenerateInputs& inputs);
// The run-option names (as --resume compares them) of those given on the command line.
std::vector<std::string> given_input_options(const CLI::App& command);

// --resume: the options not given are the checkpoint's (the adapters are reopened from the paths it stores).
void take_inputs_from_checkpoint(const io::CheckpointRun& run, const std::vector<std::string>& given,
                                 GenerateInputs& inputs);

// Before the model folder is read: the adapter list (its length first, then names and scales), the prompts'
// <lora:...> tags, true CFG, sigmas. `steps_given`: --steps was given (else --sigmas sets the step count).
void apply_inputs(const GenerateInputs& inputs, bool steps_given, pipeline::GenerateRequest& request);
// After the folder's checks: reads each adapter file's header and fits it to the transformer's (and CLIP's)
// config, and reads --latents. Reads no LoRA factor and no model weight.
void load_inputs(const GenerateInputs& inputs, const pipeline::FluxPipeline& flux, pipeline::GenerateRequest& request);

}  // namespace dp::cli
