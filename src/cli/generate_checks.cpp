// generate's checks of a request (cli/generate_checks.h).
#include "cli/generate_checks.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>

#include "cli/format.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "io/checkpoint_dir.h"
#include "io/run_dtype.h"
#include "pipeline/memory_estimate.h"
#include "runtime/components.h"
#include "tokenizers/unicode.h"

namespace dp::cli {
namespace {

// What --resume DIR knows of this request before anything loads: the model's fingerprint and the options
// given, to pick the one run of the folder this request continues (io/checkpoint_dir.h).
io::ResumeRequest resume_request(const GenerateOptions& o, const std::vector<std::string>& file_prompts) {
  io::ResumeRequest r;
  r.model_fingerprint = runtime::model_fingerprint(io::ModelFolder::open(o.model).component("transformer").path);
  r.given = o.given;
  r.run.prompts = o.prompts;
  r.run.prompts.insert(r.run.prompts.end(), file_prompts.begin(), file_prompts.end());
  r.run.num_images_per_prompt = o.num_images_per_prompt;
  r.run.height = o.height;
  r.run.width = o.width;
  r.run.steps = o.steps;
  r.run.guidance = o.guidance;
  r.run.seed = o.seed;
  r.run.max_sequence_length = o.max_sequence_length;
  if (o.was_given("dtype")) r.run.dtype = io::run_dtype_name(io::parse_run_dtype(o.dtype));
  r.run.microbatch_size = o.runtime.microbatch_size;
  r.run.set_fp8_gemms(o.runtime.fp8_gemms);
  return r;
}

bool has_extension(const std::string& path, std::initializer_list<const char*> accepted) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* a : accepted)
    if (ext == a) return true;
  return false;
}

}  // namespace

std::shared_ptr<const io::Checkpoint> read_resume_checkpoint(const GenerateOptions& o,
                                                             const std::vector<std::string>& file_prompts,
                                                             std::string& path) {
  if (o.resume.empty()) return nullptr;
  path = std::filesystem::is_directory(o.resume) ? io::select_resume_checkpoint(o.resume, resume_request(o, file_prompts))
                                                 : o.resume;
  try {
    return std::make_shared<const io::Checkpoint>(io::read_checkpoint(path));
  } catch (const Error& e) {
    throw Error(str("--resume ", e.what()), e.file(), e.line());
  }
}

void take_options_from_checkpoint(const io::CheckpointRun& c, GenerateOptions& o) {
  if (!o.was_given("prompts")) o.prompts = c.prompts;
  if (!o.was_given("num-images-per-prompt")) o.num_images_per_prompt = c.num_images_per_prompt;
  if (!o.was_given("height")) o.height = c.height;
  if (!o.was_given("width")) o.width = c.width;
  if (!o.was_given("steps")) o.steps = c.steps;
  if (!o.was_given("guidance")) o.guidance = c.guidance;
  if (!o.was_given("seed")) o.seed = c.seed;
  if (!o.was_given("max-sequence-length")) o.max_sequence_length = c.max_sequence_length;
  if (!o.was_given("dtype")) o.dtype = c.dtype;
  if (!o.was_given("microbatch-size")) o.runtime.microbatch_size = c.microbatch_size;
  if (c.fp8_gemms() && !o.runtime.fp8_gemms) {
    o.runtime.fp8_gemms = true;
    DP_INFO("--resume: the checkpoint was written with --fp8-gemms; this run continues with them");
  }
  take_inputs_from_checkpoint(c, o.given, o.inputs);
}

void check_resume_matches(const io::Checkpoint& c, const std::string& path, const GenerateOptions& o,
                          const pipeline::GenerateRequest& request, const std::string& dtype,
                          const pipeline::FluxPipeline& flux) {
  io::CheckpointRun run = runtime::checkpoint_run(request, o.runtime.microbatch_size, o.runtime.fp8_gemms);
  run.dtype = dtype;
  std::string differences;
  for (const auto& d : io::compare_runs(c.run, run, o.given))
    differences += str("\n  --", d.field, ": checkpoint ", d.in_checkpoint, ", this run ", d.in_run);
  DP_CHECK(differences.empty(), "--resume ", path, " was written with other options (leave them out to take the "
           "checkpoint's):", differences);
  const std::string fingerprint =
      runtime::model_fingerprint(flux.folder().component("transformer").path) + runtime::adapters_fingerprint(request);
  DP_CHECK(fingerprint == c.model_fingerprint, "--resume ", path, " was written for another model: transformer "
           "fingerprint ", c.model_fingerprint, " (", c.model_dir, "), --model ", o.model, " has ", fingerprint);
}

void check_prompt_text(const std::string& prompt, const std::string& where) {
  tokenizers::unicode::decode_utf8(prompt, where);  // throws "<where>: invalid UTF-8 at byte N"
}

std::vector<std::string> read_prompts_file(const std::string& path) {
  DP_CHECK(!std::filesystem::is_directory(path), path, ": --prompts-file is a directory; name a text file");
  std::ifstream in(path);
  DP_CHECK(in.good(), path, ": cannot open prompts file");
  std::vector<std::string> prompts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    check_prompt_text(line, str("line ", number, " of ", path));
    prompts.push_back(line);
  }
  DP_CHECK(!prompts.empty(), path, ": prompts file has no prompt (one prompt a line; blank lines are skipped)");
  return prompts;
}

void check_no_stray_words(const GenerateOptions& o) {
  if (o.stray_words.empty()) return;
  std::string words;
  for (const auto& w : o.stray_words) words += (words.empty() ? "" : " ") + w;
  if (o.prompts.empty())
    DP_USAGE_FAIL("unexpected argument(s) '", words, "' (generate has no positional arguments; see generate --help)");
  const std::string example = o.prompts.size() == 1 ? o.prompts.front() + " " + words : "a cat on a mat";
  DP_USAGE_FAIL("unexpected argument(s) '", words, "': each --prompt takes one prompt, so a prompt with spaces must be ",
          "quoted (--prompt \"", example, "\"); repeat --prompt for several prompts");
}

std::string output_path_for(const GenerateOptions& o) {
  const bool latent = o.output_type == "latent";
  if (o.out.empty()) return latent ? "out.h5" : "out.png";
  if (std::filesystem::path(o.out).extension().empty()) return o.out;
  if (latent)
    DP_CHECK(has_extension(o.out, {".h5", ".hdf5"}), "--out ", o.out,
             ": --output-type latent writes an HDF5 file of packed latents; name it .h5 or .hdf5 (or use "
             "--output-type png for images)");
  else
    DP_CHECK(has_extension(o.out, {".png"}), "--out ", o.out,
             ": --output-type png writes PNG images; name it .png (or use --output-type latent for HDF5 latents)");
  return o.out;
}

void check_memory(const pipeline::GenerateRequest& request, const std::string& dtype, const pipeline::FluxPipeline& flux,
                  bool decode, const at::Device& device, int64_t microbatch_size) {
  const auto transformer_config_path = flux.folder().component("transformer").path + "/config.json";
  const auto transformer = models::FluxConfig::from_json(read_json_file(transformer_config_path), transformer_config_path);
  std::optional<models::VaeConfig> vae;
  if (decode) {
    const auto vae_config_path = flux.folder().component("vae").path + "/config.json";
    vae = models::VaeConfig::from_json(read_json_file(vae_config_path), vae_config_path);
  }
  // The transformer and the VAE work on one microbatch at a time (images are decoded as microbatches finish);
  // only the latents are held for the whole batch.
  const int64_t microbatch = std::min<int64_t>(std::max<int64_t>(microbatch_size, 1), request.batch());
  pipeline::MemoryRequest memory_request{microbatch, request.height, request.width, request.max_sequence_length,
                                         request.dtype};
  if (request.lora && request.lora->mode() == models::LoraMode::unfused)
    memory_request.unfused_lora_rank = request.lora->max_rank();
  memory_request.true_cfg = request.do_true_cfg();
  auto estimate = pipeline::estimate_generate_memory(memory_request, transformer, vae ? &*vae : nullptr);
  pipeline::MemoryRequest whole_batch = memory_request;
  whole_batch.batch = request.batch();
  estimate.latents_bytes = pipeline::estimate_generate_memory(whole_batch, transformer, nullptr).latents_bytes;
  const auto available = pipeline::available_memory(device);
  auto bytes = [](double b) { return human_bytes(b >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(b)); };
  DP_DEBUG("generate: memory estimate ", bytes(estimate.peak_bytes()), " (latents ", bytes(estimate.latents_bytes),
           ", transformer block ", bytes(estimate.transformer_bytes), ", unfused LoRA ",
           bytes(estimate.unfused_lora_bytes), ", VAE decode ", bytes(estimate.vae_decode_bytes),
           "); available ", human_bytes(available.bytes), " (", available.source, ")");
  DP_CHECK(estimate.peak_bytes() <= static_cast<double>(available.bytes), request.width, "x", request.height, " x ",
           request.batch(), " image(s) in ", dtype,
           " needs at least ", bytes(estimate.peak_bytes()), " of memory on ", device.str(),
           " besides the weights (microbatches of ", microbatch, " image(s), ", estimate.sequence_length,
           " tokens: transformer block ",
           bytes(estimate.transformer_bytes),
           estimate.unfused_lora_bytes > 0 ? ", unfused LoRA path " + bytes(estimate.unfused_lora_bytes) : std::string(),
           ", latents ", bytes(estimate.latents_bytes),
           decode ? ", VAE decode " + bytes(estimate.vae_decode_bytes) : std::string(), "), but ",
           human_bytes(available.bytes), " is available (", available.source,
           "); lower --height/--width, --microbatch-size, the number of prompts or --num-images-per-prompt");
}

void check_world_size(const GenerateOptions& o, const runtime::World& world) {
  DP_CHECK(o.ranks >= 0, "--ranks ", o.ranks, ": expected 0 (any) or the number of ranks the run needs");
  if (o.ranks == 0 || o.ranks == world.size()) return;
  const std::string source = o.config.empty() ? std::string("--ranks") : str("--config ", o.config, " (key \"ranks\")");
  DP_FAIL(source, " needs ", o.ranks, " rank(s), but ", world.size() == 1 ? "this process runs alone" : str("the MPI world has ", world.size()),
          ": start it with `mpirun -np ", o.ranks, "` (or launch/mpirun.sh, which reads the config), or `srun -n ",
          o.ranks, " --mpi=pmix`; or override with --ranks N on the command line if you adapted the map");
}

}  // namespace dp::cli
