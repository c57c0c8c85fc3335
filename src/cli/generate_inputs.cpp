#include "cli/generate_inputs.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "io/hdf5_latents.h"
#include "io/lora_file.h"
#include "models/clip/clip_config.h"
#include "models/flux/flux_config.h"
#include "models/lora.h"
#include "models/lora_check.h"
#include "pipeline/prompt_adapters.h"

namespace dp::cli {
namespace {

std::vector<io::LoraSpec> lora_specs(const GenerateInputs& inputs) {
  // The length first: a list of 10000 adapters is refused before any of them is looked at.
  DP_CHECK(inputs.lora.size() <= io::kMaxLoraAdapters, inputs.lora.size(), " LoRA adapters given; at most ",
           io::kMaxLoraAdapters, " can be used in one run");
  std::vector<io::LoraSpec> specs;
  for (const auto& word : inputs.lora) specs.push_back(io::parse_lora_spec(word));
  io::check_lora_specs(specs);
  return specs;
}

std::string exact(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

void log_adapter(const io::LoraSpec& spec, const io::LoraFile& file) {
  int64_t transformer = 0, text_encoder = 0;
  for (const auto& m : file.modules) (m.component == io::LoraComponent::transformer ? transformer : text_encoder) += 1;
  DP_INFO("LoRA '", spec.name, "' (", spec.path, "): ", io::lora_layout_name(file.layout), " layout, ", transformer,
          " transformer module(s), ", text_encoder, " text-encoder module(s), rank ", file.min_rank(),
          file.max_rank() != file.min_rank() ? str("-", file.max_rank()) : std::string(), ", scale ", spec.scale);
  for (const auto& why : file.ignored) DP_WARN("LoRA '", spec.name, "': ignored as diffusers ignores it: ", why);
}

}  // namespace

void add_generate_input_options(CLI::App& cmd, GenerateInputs& inputs) {
  cmd.add_option("--lora", inputs.lora,
                 "a LoRA adapter: [NAME=]FILE[:SCALE] (scale default 1; name default the file name without "
                 ".safetensors); repeat for several, each merged at its scale as diffusers' load_lora_weights + "
                 "set_adapters gives. Layouts: diffusers/PEFT (transformer.*.lora_A/lora_B, text_encoder.*, alpha), "
                 "kohya (lora_unet_double_blocks_*) and BFL (diffusion_model.double_blocks.*). Run config key "
                 "\"lora\": a list of {\"path\", \"scale\", \"name\"}. At most 64")
      ->allow_extra_args(false);
  cmd.add_option("--lora-mode", inputs.lora_mode,
                 "fused: the adapters are merged into the weights as each block loads (the step costs what it costs "
                 "without them); unfused: base weights stay, the low-rank path runs in the forward (a little "
                 "slower), and each prompt may choose its adapters by starting with <lora:NAME[:SCALE]> tags "
                 "(<lora:none> for none; untagged prompts use every adapter at its --lora scale)")
      ->capture_default_str();
  cmd.add_option("--negative-prompt", inputs.negative_prompts,
                 "true classifier-free guidance as FluxPipeline's negative_prompt: one for every prompt, or repeat it "
                 "once per prompt; used when --true-cfg-scale > 1 (each step then runs twice)")
      ->allow_extra_args(false);
  cmd.add_option("--true-cfg-scale", inputs.true_cfg_scale,
                 "FluxPipeline's true_cfg_scale: above 1 with --negative-prompt, noise = uncond + scale * (cond - "
                 "uncond); the --guidance embedding stays as it is for both passes")
      ->capture_default_str();
  cmd.add_option("--sigmas", inputs.sigmas,
                 "a custom schedule as FluxPipeline's sigmas: comma-separated noise levels in [0, 1], one per step "
                 "(the scheduler shifts them as usual; --steps defaults to their count)")
      ->delimiter(',')
      ->allow_extra_args(false);
  cmd.add_option("--latents", inputs.latents,
                 "initial packed latents from an HDF5 file (dataset 'latents' (B, tokens, channels), as "
                 "--output-type latent writes it) instead of drawing them from --seed; every rank reads it");
}

std::vector<std::string> given_input_options(const CLI::App& cmd) {
  std::vector<std::string> given;
  for (const auto& [flag, field] : std::vector<std::pair<std::string, std::string>>{
           {"--lora", "lora"}, {"--lora-mode", "lora"}, {"--negative-prompt", "negative-prompt"},
           {"--true-cfg-scale", "true-cfg-scale"}, {"--sigmas", "sigmas"}, {"--latents", "latents"}})
    if (cmd.count(flag) > 0 && std::find(given.begin(), given.end(), field) == given.end()) given.push_back(field);
  return given;
}

void take_inputs_from_checkpoint(const io::CheckpointRun& run, const std::vector<std::string>& given,
                                 GenerateInputs& inputs) {
  const auto was_given = [&](const char* f) { return std::find(given.begin(), given.end(), f) != given.end(); };
  if (!was_given("negative-prompt")) inputs.negative_prompts = run.negative_prompts;
  if (!was_given("true-cfg-scale")) inputs.true_cfg_scale = run.true_cfg_scale;
  if (!was_given("sigmas")) inputs.sigmas = run.custom_sigmas;
  if (!was_given("lora") && !run.lora.empty()) {
    // The adapters are opened again from the paths the checkpoint names; their fingerprint must still match.
    nlohmann::json lora;
    try {
      lora = nlohmann::json::parse(run.lora);
      inputs.lora_mode = lora.at("mode").get<std::string>();
      inputs.lora.clear();
      for (const auto& a : lora.at("adapters"))
        inputs.lora.push_back(a.at("name").get<std::string>() + "=" + a.at("path").get<std::string>() + ":" +
                              exact(a.at("scale").get<double>()));
    } catch (const nlohmann::json::exception& e) {
      DP_FAIL("--resume: the checkpoint's LoRA record cannot be read (", e.what(), ")");
    }
  }
}

void apply_inputs(const GenerateInputs& inputs, bool steps_given, pipeline::GenerateRequest& request) {
  const auto specs = lora_specs(inputs);
  const auto mode = models::parse_lora_mode(inputs.lora_mode);
  const auto chosen = pipeline::parse_prompt_adapters(request.prompts, specs);
  if (chosen.any_tagged) {
    DP_CHECK(mode == models::LoraMode::unfused, "prompts choose their LoRA adapters with <lora:...> tags: that needs "
             "--lora-mode unfused (fused mode merges one choice of adapters into the weights)");
    request.prompt_texts = chosen.texts;
    request.prompt_adapters = chosen.choice_per_prompt;
  }
  request.negative_prompts = inputs.negative_prompts;
  request.true_cfg_scale = inputs.true_cfg_scale;
  if (!inputs.negative_prompts.empty() && !(inputs.true_cfg_scale > 1))
    DP_WARN("--negative-prompt is not used: --true-cfg-scale is ", inputs.true_cfg_scale,
            " (FluxPipeline runs true CFG only above 1)");
  if (inputs.negative_prompts.empty() && inputs.true_cfg_scale > 1)
    DP_WARN("--true-cfg-scale ", inputs.true_cfg_scale, " is not used without --negative-prompt (as in FluxPipeline)");
  request.sigmas = inputs.sigmas;
  if (!inputs.sigmas.empty() && !steps_given) request.steps = static_cast<int>(inputs.sigmas.size());
}

void load_inputs(const GenerateInputs& inputs, const pipeline::FluxPipeline& flux, pipeline::GenerateRequest& request) {
  const auto specs = lora_specs(inputs);
  if (!specs.empty()) {
    const auto& folder = flux.folder();
    const std::string flux_config_path = folder.component("transformer").path + "/config.json";
    const auto flux_config = models::FluxConfig::from_json(read_json_file(flux_config_path), flux_config_path);
    std::optional<models::ClipTextConfig> clip;
    if (folder.has("text_encoder")) {
      const std::string clip_config_path = folder.component("text_encoder").path + "/config.json";
      clip = models::ClipTextConfig::from_json(read_json_file(clip_config_path), clip_config_path);
    }
    std::vector<models::LoraAdapter> adapters;
    for (const auto& spec : specs) {
      io::LoraFile file = io::read_lora_file(spec.path);
      models::fit_lora_to_model(file, flux_config, clip ? &*clip : nullptr);
      log_adapter(spec, file);
      adapters.push_back({spec, std::move(file)});
    }
    const auto chosen = pipeline::parse_prompt_adapters(request.prompts, specs);
    request.lora = std::make_shared<const models::LoraSet>(std::move(adapters), models::parse_lora_mode(inputs.lora_mode),
                                                           chosen.choices);
  }
  if (!inputs.latents.empty()) {
    const io::LatentsFile file = io::read_latents_hdf5(inputs.latents);
    std::vector<float> values = file.values;
    request.latents = at::from_blob(values.data(), file.shape, at::TensorOptions().dtype(at::kFloat)).clone();
    // A digest of the values, so that a resume given --latents can tell the same file from another.
    uint64_t hash = 0xcbf29ce484222325ULL;
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
    for (size_t i = 0; i < values.size() * sizeof(float); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
    char digest[17];
    std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(hash));
    request.latents_source = str(inputs.latents, " (values ", digest, ")");
    DP_INFO("initial latents from ", request.latents_source, ": ", request.latents.sizes());
  }
}

}  // namespace dp::cli
