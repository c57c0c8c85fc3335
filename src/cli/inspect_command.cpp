// `diffpipe inspect`: what a model folder holds, from safetensors headers only (no weights are read), and
// what is wrong with it: the same component checks `generate` runs before any compute.
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "cli/command.h"
#include "cli/format.h"
#include "cli/inspect_lora.h"
#include "cli/inspect_png.h"
#include "core/error.h"
#include "core/json_file.h"
#include "io/checkpoint_dir.h"
#include "io/checkpoint_file.h"
#include "io/hub_cache.h"
#include "io/model_folder.h"
#include "io/weight_index.h"
#include "models/component_check.h"

namespace dp::cli {
namespace {

struct ModuleSummary {
  uint64_t tensors = 0;
  uint64_t parameters = 0;
  uint64_t bytes = 0;
  std::set<std::string> dtypes;
};

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

// Parameters, bytes and dtypes per top-level module, from the headers; null when they do not parse (the
// component check has then reported why).
nlohmann::json summarise_weights(const io::Component& component) {
  std::optional<io::WeightIndex> weights;
  try {
    weights = io::WeightIndex::open_dir(component.path);
  } catch (const Error&) {
    return nullptr;
  }
  std::map<std::string, ModuleSummary> modules;  // keyed by top-level module name
  ModuleSummary total;
  for (const auto& name : weights->names()) {
    const auto& info = weights->info(name);
    const std::string top = name.substr(0, name.find('.'));
    for (ModuleSummary* s : {&modules[top], &total}) {
      s->tensors += 1;
      s->parameters += info.numel();
      s->bytes += info.nbytes();
      s->dtypes.insert(std::string(io::dtype_name(info.dtype)));
    }
  }
  nlohmann::json summary = {{"parameters", total.parameters},
                            {"bytes", total.bytes},
                            {"dtypes", total.dtypes},
                            {"modules", nlohmann::json::array()}};
  for (const auto& [name, s] : modules) {
    summary["modules"].push_back(
        {{"module", name}, {"tensors", s.tensors}, {"parameters", s.parameters}, {"bytes", s.bytes}, {"dtypes", s.dtypes}});
  }
  return summary;
}

void print_tables(const nlohmann::json& report) {
  std::cout << "model: " << report["model"].get<std::string>() << "\n";
  for (const auto& c : report["components"]) {
    std::cout << "\n" << c["name"].get<std::string>() << " (" << c["class"].get<std::string>() << ")";
    if (!c.contains("parameters")) {
      std::cout << ": no weights\n";
    } else {
      std::cout << ": " << human_count(c["parameters"].get<uint64_t>()) << " parameters, "
                << human_bytes(c["bytes"].get<uint64_t>()) << ", " << join(c["dtypes"].get<std::set<std::string>>())
                << "\n";
      std::cout << "  " << std::left << std::setw(34) << "module" << std::right << std::setw(9) << "tensors"
                << std::setw(16) << "parameters" << std::setw(16) << "bytes" << "  dtypes\n";
      for (const auto& m : c["modules"]) {
        std::cout << "  " << std::left << std::setw(34) << m["module"].get<std::string>() << std::right << std::setw(9)
                  << m["tensors"].get<uint64_t>() << std::setw(16) << human_count(m["parameters"].get<uint64_t>())
                  << std::setw(16) << human_bytes(m["bytes"].get<uint64_t>()) << "  " << join(m["dtypes"].get<std::set<std::string>>()) << "\n";
      }
    }
    for (const auto& problem : c["problems"]) std::cout << "  problem: " << problem.get<std::string>() << "\n";
  }
}

void run_inspect(const std::string& model_dir, bool as_json) {
  const auto folder = io::ModelFolder::open(model_dir);
  const auto problems = models::check_model_folder(folder);
  nlohmann::json report = {{"model", model_dir}, {"components", nlohmann::json::array()}};
  for (const auto& component : folder.components()) {
    nlohmann::json entry = {{"name", component.name},
                            {"class", component.class_name},
                            {"library", component.library},
                            {"modules", nlohmann::json::array()},
                            {"problems", nlohmann::json::array()}};
    for (const auto& p : problems)
      if (p.component == component.name) entry["problems"].push_back(p.message);
    if (component.has_weights) {
      const auto summary = summarise_weights(component);
      if (!summary.is_null()) entry.update(summary);
    }
    report["components"].push_back(entry);
  }
  report["problems"] = problems.size();
  if (as_json) {
    std::cout << report.dump(2) << "\n";
  } else {
    print_tables(report);
  }
  // Exiting non-zero lets a script validate a folder without running it; the report says what is wrong.
  DP_CHECK(problems.empty(), model_dir, ": ", problems.size(), problems.size() == 1 ? " problem" : " problems",
           " found (listed above)");
}

// The adapters' record as JSON when it parses (it is written as JSON), else as the text it is.
nlohmann::ordered_json adapters_json(const std::string& record) {
  if (record.empty()) return nullptr;
  auto parsed = nlohmann::ordered_json::parse(record, nullptr, /*allow_exceptions=*/false);
  return parsed.is_discarded() ? nlohmann::ordered_json(record) : parsed;
}

// The format-3 options a run used, as generate's flags (the negative prompts, the initial latents and the
// adapters have lines of their own).
std::string format_3_options(const io::CheckpointRun& run) {
  std::ostringstream out;
  if (!run.negative_prompts.empty() || run.true_cfg_scale != 1.0) out << " --true-cfg-scale " << run.true_cfg_scale;
  if (!run.custom_sigmas.empty()) {
    out << " --sigmas ";
    for (size_t i = 0; i < run.custom_sigmas.size(); ++i) out << (i > 0 ? "," : "") << run.custom_sigmas[i];
  }
  return out.str();
}

// `inspect --checkpoint FILE`: what a denoising checkpoint holds, read and validated as --resume would.
void inspect_checkpoint_file(const std::string& path, bool as_json) {
  const io::Checkpoint c = io::read_checkpoint(path);  // throws naming what is wrong
  nlohmann::ordered_json images = nlohmann::ordered_json::array();
  for (size_t i = 0; i < c.image_steps.size(); ++i) {
    const size_t prompt = i / static_cast<size_t>(c.run.num_images_per_prompt);
    images.push_back({{"image", i}, {"prompt", prompt}, {"steps_done", c.image_steps[i]}});
  }
  nlohmann::ordered_json report = {
      {"checkpoint", path},
      {"format_version", c.format_version},
      {"run_id", c.run_id},
      {"request_fingerprint", c.request_fingerprint},
      {"steps_done", c.steps_done()},
      {"steps", c.run.steps},
      {"finished", c.finished()},
      {"prompts", c.run.prompts},
      {"images", images},
      {"model", c.model_dir},
      {"model_fingerprint", c.model_fingerprint},
      {"options", {{"height", c.run.height}, {"width", c.run.width}, {"steps", c.run.steps},
                   {"guidance", c.run.guidance}, {"seed", c.run.seed}, {"dtype", c.run.dtype},
                   {"num_images_per_prompt", c.run.num_images_per_prompt},
                   {"max_sequence_length", c.run.max_sequence_length}, {"microbatch_size", c.run.microbatch_size},
                   {"fp8_gemms", c.run.fp8_gemms()}, {"negative_prompts", c.run.negative_prompts},
                   {"true_cfg_scale", c.run.true_cfg_scale}, {"sigmas", c.run.custom_sigmas},
                   {"latents", c.run.initial_latents}, {"lora", adapters_json(c.run.lora)}}},
      {"world_size", c.world_size},
      {"device_map", c.device_map},
      {"written_by", c.written_by},
      {"latents_shape", c.latents.shape},
      {"prompt_embeds_shape", c.prompt_embeds.shape},
      {"pooled_prompt_embeds_shape", c.pooled.shape}};
  if (as_json) {
    std::cout << report.dump(2) << "\n";
    return;
  }
  std::cout << "checkpoint: " << path << " (format version " << c.format_version << ", valid)\n"
            << "run: " << (c.run_id.empty() ? std::string("(none: format version 1)") : c.run_id)
            << ", request fingerprint " << c.request_fingerprint << "\n"
            << "progress: " << c.steps_done() << "/" << c.run.steps << " steps done by the slowest image"
            << (c.finished() ? " (finished: a resume only decodes)" : "") << "\n"
            << "model: " << c.model_dir << " (fingerprint " << c.model_fingerprint << ")\n"
            << "written by " << c.written_by << " on " << c.world_size << " rank(s), device map " << c.device_map
            << "\n"
            << "options: --height " << c.run.height << " --width " << c.run.width << " --steps " << c.run.steps
            << " --guidance " << c.run.guidance << " --seed " << c.run.seed << " --dtype " << c.run.dtype
            << " --num-images-per-prompt " << c.run.num_images_per_prompt << " --max-sequence-length "
            << c.run.max_sequence_length << " --microbatch-size " << c.run.microbatch_size
            << (c.run.fp8_gemms() ? " --fp8-gemms" : "") << format_3_options(c.run) << "\n";
  for (size_t p = 0; p < c.run.negative_prompts.size(); ++p)
    std::cout << "negative prompt " << p << ": \"" << c.run.negative_prompts[p] << "\"\n";
  if (!c.run.initial_latents.empty()) std::cout << "initial latents (--latents): " << c.run.initial_latents << "\n";
  if (!c.run.lora.empty()) std::cout << "adapters (--lora): " << c.run.lora << "\n";
  for (size_t p = 0; p < c.run.prompts.size(); ++p) {
    std::cout << "prompt " << p << ": \"" << c.run.prompts[p] << "\"\n  steps done per image:";
    for (int n = 0; n < c.run.num_images_per_prompt; ++n)
      std::cout << " " << c.image_steps[p * static_cast<size_t>(c.run.num_images_per_prompt) + static_cast<size_t>(n)];
    std::cout << "\n";
  }
}

// `inspect --checkpoint DIR`, as --resume DIR takes a folder: the newest checkpoint of each run there that reads
// and validates (a damaged newer one is named and skipped, as --resume skips it).
void inspect_checkpoint(const std::string& path, bool as_json) {
  if (!std::filesystem::is_directory(path)) return inspect_checkpoint_file(path, as_json);
  std::map<std::string, const io::CheckpointEntry*> newest_of_run;
  const auto entries = io::scan_checkpoint_dir(path);  // oldest step first
  for (const auto& entry : entries) {
    if (!entry.problem.empty()) {
      std::cerr << "inspect: " << entry.path << " skipped: " << entry.problem << "\n";
      continue;
    }
    newest_of_run[entry.run_key()] = &entry;
  }
  DP_CHECK(!newest_of_run.empty(), path, ": no readable checkpoint (checkpoint-stepNNNNNN-RUNID.h5) in this folder");
  if (as_json && newest_of_run.size() > 1) std::cout << "[\n";
  size_t printed = 0;
  for (const auto& [run, entry] : newest_of_run) {
    if (printed++ > 0) std::cout << (as_json ? ",\n" : "\n");
    if (!as_json && newest_of_run.size() > 1) std::cout << "run " << run << " (newest of its checkpoints):\n";
    inspect_checkpoint_file(entry->path, as_json);
  }
  if (as_json && newest_of_run.size() > 1) std::cout << "]\n";
}

CommandRegistrar registrar("inspect", 50, [](CLI::App& root) {
  auto* cmd = root.add_subcommand("inspect", "List components, parameter counts, dtypes and bytes per top-level "
                                             "module, from safetensors headers only, and check each component "
                                             "as generate does before it runs (exit status 3 on any problem)");
  auto model = std::make_shared<std::string>();
  auto checkpoint = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto lora = std::make_shared<LoraInspectOptions>();
  auto* model_option = cmd->add_option(
      "--model", *model, "diffusers model folder (or one component folder), or a Hugging Face model id in the local cache");
  auto revision = std::make_shared<std::string>();
  cmd->add_option("--revision", *revision, "with a model id: branch, tag or commit of the cached snapshot (main)");
  cmd->add_option("--lora", lora->path,
                  "a LoRA adapter file: its layout (diffusers/PEFT, kohya, BFL), ranks, alphas and the diffusers modules "
                  "it changes, as diffusers reads it (header and alphas only); with --model, fitted to that pipeline; "
                  "with --device-map or --world-size too, what each rank would read");
  cmd->add_option("--device-map", lora->device_map,
                  "with --lora and --model: the transformer split whose ranks to list, as plan takes it (default: "
                  "pipeline)");
  cmd->add_option("--world-size", lora->world_size, "with --lora and --model: ranks of that split");
  cmd->add_option("--max-memory", lora->max_memory, "with --lora and --model: as plan takes it");
  auto* checkpoint_option = cmd->add_option(
      "--checkpoint", *checkpoint,
      "instead of a model: a denoising checkpoint (generate --checkpoint-dir), or a folder of them (the newest "
      "of each run there, as --resume DIR picks): its prompts, steps done per image, "
      "model fingerprint and options, after the checks --resume makes (exit status 3 when it would refuse it)");
  model_option->excludes(checkpoint_option);
  cmd->add_flag("--json", *as_json, "print one JSON object instead of tables");
  auto png = std::make_shared<std::string>();
  cmd->add_option("png", *png, "a PNG image: the prompt, seed and settings generate stored in its text chunks")
      ->excludes(model_option)
      ->excludes(checkpoint_option);
  cmd->callback([model, checkpoint, as_json, lora, png, revision] {
    if (!model->empty()) *model = io::resolve_model_argument(*model, *revision);
    DP_CHECK(!model->empty() || !checkpoint->empty() || !lora->path.empty() || !png->empty(),
             "inspect needs --model DIR, --checkpoint FILE|DIR, --lora FILE or a PNG file");
    if (!png->empty()) {
      inspect_png(*png, *as_json);
    } else if (!lora->path.empty()) {
      lora->model = *model;
      lora->json = *as_json;
      inspect_lora(*lora);
    } else if (!checkpoint->empty())
      inspect_checkpoint(*checkpoint, *as_json);
    else
      run_inspect(*model, *as_json);
  });
});

}  // namespace
}  // namespace dp::cli
