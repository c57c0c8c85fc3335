// `diffpipe generate`: the whole FLUX pipeline in one process, with diffusers' defaults and numbers.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/command.h"
#include "cli/format.h"
#include "cli/generate_inputs.h"
#include "cli/generate_microbatch.h"
#include "cli/generate_paths.h"
#include "cli/png_metadata.h"
#include "cli/trace_option.h"
#include "cli/torch_boundary.h"
#include "core/atomic_file.h"
#include "core/output_policy.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/human_units.h"
#include "core/json_file.h"
#include "core/log.h"
#include "io/checkpoint_dir.h"
#include "io/checkpoint_file.h"
#include "io/hdf5_latents.h"
#include "io/hub_cache.h"
#include "io/png_image.h"
#include "io/run_dtype.h"
#include "io/torch_tensors.h"
#include "pipeline/flux_pipeline.h"
#include "pipeline/memory_estimate.h"
#include "placement/calibration.h"
#include "placement/mesh.h"
#include "runtime/components.h"
#include "io/parallel_load.h"
#include "runtime/distributed_generate.h"
#include "runtime/world.h"
#include "tokenizers/unicode.h"

namespace dp::cli {
namespace {

// --transport-timeout's ceiling: a wait of more than a few months is a typo, not a plan.
constexpr double kMaxTransportTimeout = 1e7;

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
  return r;
}

// --resume: reads and validates the checkpoint (a directory: the newest valid one of the run this request
// matches) and fills the options the user did not give from it. Mismatches with the options given are checked
// once the size is resolved.
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
  take_inputs_from_checkpoint(c, o.given, o.inputs);
}

// After the size is resolved: every option given must match the checkpoint, and so must the model.
void check_resume_matches(const io::Checkpoint& c, const std::string& path, const GenerateOptions& o,
                          const pipeline::GenerateRequest& request, const std::string& dtype,
                          const pipeline::FluxPipeline& flux) {
  io::CheckpointRun run = runtime::checkpoint_run(request, o.runtime.microbatch_size);
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

// Prompts are checked as they are read, so that a bad one is named where the user can find it.
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

// `--prompt a cat on a mat` gives --prompt "a" and four words nobody asked for: refuse rather than guess.
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

bool has_extension(const std::string& path, std::initializer_list<const char*> accepted) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* a : accepted)
    if (ext == a) return true;
  return false;
}

// --out follows --output-type: out.png or out.h5 by default, and a name that promises the other format is
// refused (an HDF5 file named .png is a wrong result that exits 0). A name without an extension (/dev/null,
// a FIFO) is fine.
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

// /dev/null takes every image in place, rather than out-0.png, out-1.png ... beside it (in /dev). Every other
// non-regular target is refused by the output policy (core/output_policy.h).
bool writes_in_place(const std::string& path) { return is_dev_null(path); }

// Refuses before any work a request whose activations cannot fit the device's memory, with the estimate.
// `device` is this rank's; `decode` whether this rank decodes (the VAE's rank, for PNG output).
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

// --report-json: the stage reports and the denoising loop's step times, for benchmark scripts.
// "height"/"width" are the image's, after rounding to the VAE's multiple (100x130 gives 96x128, as diffusers);
// the requested ones are kept beside them.
void write_report_json(const GenerateOptions& o, const std::string& dtype, const pipeline::GenerateRequest& request,
                       const pipeline::LatentGrid& grid, const std::vector<pipeline::StageReport>& stages,
                       const std::vector<double>& step_ends, double total_seconds) {
  nlohmann::json doc = {{"model", o.model},
                        {"device", o.device},
                        {"dtype", dtype},
                        {"height", grid.image_height()},
                        {"width", grid.image_width()},
                        {"requested_height", request.height},
                        {"requested_width", request.width},
                        {"steps", request.steps},
                        {"batch", request.batch()},
                        {"total_seconds", total_seconds},
                        {"stages", nlohmann::json::array()}};
  for (const auto& s : stages)
    doc["stages"].push_back({{"name", s.name},
                             {"seconds", s.seconds},
                             {"load_seconds", s.load_seconds},
                             {"peak_resident_bytes", s.peak_resident_bytes},
                             {"peak_device_bytes", s.peak_device_bytes}});
  // Seconds from the first step's start to each step's end (device synchronised): the loop without the
  // transformer's loading, which the denoise stage includes.
  doc["step_end_seconds"] = step_ends;
  doc["denoise_loop_seconds"] = step_ends.empty() ? 0.0 : step_ends.back();
  // Step 1 against the median later step: what the first use of kernels and handles still costs in the loop.
  std::vector<double> later;
  for (size_t s = 1; s < step_ends.size(); ++s) later.push_back(step_ends[s] - step_ends[s - 1]);
  std::sort(later.begin(), later.end());
  const double steady = later.empty() ? 0.0 : later[later.size() / 2];
  doc["steady_step_seconds"] = steady;
  doc["first_step_ratio"] = steady > 0 ? step_ends.front() / steady : 0.0;
  doc["loads"] = io::load_figures_json(io::load_history());
  write_json_file(o.report_json, doc);
}

// What made image `index` of the batch, for its PNG text chunks.
ImageSettings image_settings(const pipeline::GenerateRequest& request, int64_t index, const std::string& model,
                             const std::string& dtype) {
  ImageSettings s;
  const auto prompt = static_cast<size_t>(index / request.num_images_per_prompt);
  s.prompt = request.prompts.at(prompt);
  if (request.do_true_cfg()) {
    s.negative_prompt = request.negative_prompts.at(request.negative_prompts.size() == 1 ? 0 : prompt);
    s.true_cfg_scale = request.true_cfg_scale;
  }
  s.seed = request.seed;
  s.image_index = index;
  s.batch = request.batch();
  s.steps = request.steps;
  s.guidance = request.guidance;
  s.width = request.width;
  s.height = request.height;
  s.model = model;
  s.dtype = dtype;
  return s;
}

// out.png -> out-0.png, out-1.png ... when there are several images, in diffusers' order.
std::string numbered_path(const std::string& path, int64_t index, int64_t count) {
  if (count == 1) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(index) + p.extension().string())).string();
}

// A config written for N GPUs (its "ranks") refuses another world size before any file is read: the
// device map, max_memory and the expected speed were chosen for N.
void check_world_size(const GenerateOptions& o, const runtime::World& world) {
  DP_CHECK(o.ranks >= 0, "--ranks ", o.ranks, ": expected 0 (any) or the number of ranks the run needs");
  if (o.ranks == 0 || o.ranks == world.size()) return;
  const std::string source = o.config.empty() ? std::string("--ranks") : str("--config ", o.config, " (key \"ranks\")");
  DP_FAIL(source, " needs ", o.ranks, " rank(s), but ", world.size() == 1 ? "this process runs alone" : str("the MPI world has ", world.size()),
          ": start it with `mpirun -np ", o.ranks, "` (or launch/mpirun.sh, which reads the config), or `srun -n ",
          o.ranks, " --mpi=pmix`; or override with --ranks N on the command line if you adapted the map");
}

void generate_on_this_rank(const GenerateOptions& given_options) {
  GenerateOptions o = given_options;
  if (o.output_type == "pil") o.output_type = "png";  // diffusers' output_type="pil" is our PNG files
  o.device = resolve_device_name(o.device);
  // Everything up to the folder's checks is cheap: a bad request fails in milliseconds, before any weight is
  // read, and leaves no file behind.
  const auto& world = runtime::World::get();
  check_no_stray_words(o);
  const std::string model_as_given = o.model;
  o.model = io::resolve_model_argument(o.model, o.revision);
  if (o.model != model_as_given && world.is_coordinator()) DP_INFO("--model ", model_as_given, ": ", o.model);

  auto& checkpoints = o.runtime.checkpoints;
  DP_CHECK(checkpoints.every >= 0, "--checkpoint-every must be 0 or more steps, got ", checkpoints.every);
  DP_CHECK(checkpoints.keep >= 1, "--keep-checkpoints must be at least 1, got ", checkpoints.keep);
  DP_CHECK(checkpoints.every == 0 || !checkpoints.dir.empty(), "--checkpoint-every needs --checkpoint-dir");
  DP_CHECK(!checkpoints.share_dir || !checkpoints.dir.empty(), "--share-checkpoint-dir needs --checkpoint-dir");
  // Every wait is bounded by it: zero, a negative number or nan would end the run as "stuck ranks".
  const double timeout = o.runtime.transport_timeout_seconds;
  DP_CHECK(std::isfinite(timeout) && timeout > 0 && timeout <= kMaxTransportTimeout, "--transport-timeout ", timeout,
           ": expected a positive, finite number of seconds (at most ", kMaxTransportTimeout, ")");
  // Every rank: a stop signal, forwarded by mpirun or sent to any one rank, must not kill a stage before the
  // coordinator checkpoints (runtime/stop_request.h).
  if (!checkpoints.dir.empty()) runtime::install_stop_signal_handlers();
  const std::vector<std::string> file_prompts =
      o.prompts_file.empty() ? std::vector<std::string>{} : read_prompts_file(o.prompts_file);
  checkpoints.resume = read_resume_checkpoint(o, file_prompts, checkpoints.resume_path);
  if (checkpoints.resume) take_options_from_checkpoint(checkpoints.resume->run, o);
  // The run the checkpoints belong to: a resumed run continues its own (its older files rotate away).
  checkpoints.run_id = checkpoints.resume && !checkpoints.resume->run_id.empty() ? checkpoints.resume->run_id
                                                                                 : io::new_run_id();
  pipeline::GenerateRequest request;
  for (size_t i = 0; i < o.prompts.size(); ++i) check_prompt_text(o.prompts[i], str("prompt ", i + 1));
  request.prompts = o.prompts;
  request.prompts.insert(request.prompts.end(), file_prompts.begin(), file_prompts.end());
  DP_CHECK(!request.prompts.empty(), "give at least one --prompt or a --prompts-file");
  request.num_images_per_prompt = o.num_images_per_prompt;
  request.height = o.height;
  request.width = o.width;
  request.steps = o.steps;
  request.guidance = o.guidance;
  request.seed = o.seed;
  request.max_sequence_length = o.max_sequence_length;
  // Canonical spelling (bf16, not bfloat16) for logs, reports and the latents file's attribute.
  const std::string dtype =
      io::run_dtype_name(io::parse_run_dtype(o.dtype.empty() ? default_dtype_for(o.device) : o.dtype));
  request.dtype = io::parse_run_scalar_type(dtype);
  DP_CHECK(o.output_type == "png" || o.output_type == "latent", "--output-type: expected png or latent, got '",
           o.output_type, "'");
  for (size_t i = 0; i < o.inputs.negative_prompts.size(); ++i)
    check_prompt_text(o.inputs.negative_prompts[i], str("negative prompt ", i + 1));
  apply_inputs(o.inputs, o.was_given("steps"), request);
  request.validate();
  const bool decode = o.output_type == "png";
  const std::string out = output_path_for(o);
  const int64_t outputs_count = decode ? request.batch() : 1;
  std::vector<std::string> out_paths;
  for (int64_t i = 0; i < outputs_count; ++i)
    out_paths.push_back(writes_in_place(out) ? out : numbered_path(out, i, outputs_count));
  {
    // Every path of the run, before anything loads (cli/generate_paths.h).
    GeneratePaths paths;
    paths.outputs = out_paths;
    paths.report_json = o.report_json;
    paths.report = o.runtime.report_path;
    paths.checkpoint_dir = checkpoints.dir;
    paths.run_id = checkpoints.run_id;
    paths.may_share_checkpoint_dir = checkpoints.share_dir || checkpoints.resume != nullptr;
    paths.embeddings_cache = checkpoints.embeddings_cache;
    paths.resume_file = checkpoints.resume_path;
    paths.prompts_file = o.prompts_file;
    paths.config = o.config;
    paths.model = o.model;
    paths.rank = world.rank();
    paths.world_size = world.size();
    check_generate_paths(paths);
  }
  if (world.is_coordinator() && checkpoints.resume && !checkpoints.embeddings_cache.empty())
    DP_INFO("--embeddings-cache ", checkpoints.embeddings_cache, ": not used (--resume takes the prompt embeddings "
            "from the checkpoint)");
  if (world.is_coordinator() && !checkpoints.dir.empty()) {
    const auto& resumed = checkpoints.resume;
    DP_INFO("checkpoints: run ", checkpoints.run_id, " in ", checkpoints.dir,
            !resumed ? std::string(" (a new run)")
            : !resumed->run_id.empty() ? std::string(" (the run resumed)")
                                       : str(" (", checkpoints.resume_path, " is of format version 1, without a run id: "
                                             "this run gets a new one and leaves that file in place)"));
  }
  if (o.dry_run) {
    // What needs no GPU and no weights: the folder's components (headers), so that a command can be checked on
    // any machine (the README's quickstart test does).
    pipeline::FluxPipeline flux(io::ModelFolder::open(o.model));
    flux.check_components(decode);
    if (world.is_coordinator())
      std::cout << "dry run: the request is valid (" << request.prompts.size() << " prompt(s), " << request.steps
                << " steps, " << dtype << " on " << o.device << ", model " << o.model << ", " << world.size()
                << " rank(s)); not checked: the device, the transport and the memory\n";
    return;
  }
  // The transport is settled before the device is opened or anything loaded: --transport nccl on the CPU or
  // without NCCL in the build fails here, in milliseconds.
  runtime::choose_transport(o.runtime.transport, o.device == "cuda", world.size());
  request.device = usable_device(o.device);
  const at::Device this_rank_device = runtime::rank_device(request.device, world);

  pipeline::FluxPipeline flux(io::ModelFolder::open(o.model));
  flux.check_components(decode);
  // The adapters' headers and the latents file, fitted to the configs: still before any weight is read.
  load_inputs(o.inputs, flux, request);
  request.validate();
  const auto grid = flux.resolve_image_size(request);
  if (checkpoints.resume) check_resume_matches(*checkpoints.resume, checkpoints.resume_path, o, request, dtype, flux);
  // --sequence-parallel K, before any weight is read: it must divide the world and the transformer's heads and
  // leave every rank text and image tokens; the refusal names the values that would do.
  const auto transformer_config_path = flux.folder().component("transformer").path + "/config.json";
  const auto transformer = models::FluxConfig::from_json(read_json_file(transformer_config_path), transformer_config_path);
  placement::check_mesh(world.size(), o.runtime.sequence_parallel,
                        {transformer.num_attention_heads, request.max_sequence_length, grid.tokens()});
  // --microbatch-size 0: the size with the most simulated images/s, chosen before anything loads (every rank the
  // same; the request agreement includes it).
  if (o.runtime.microbatch_size == 0)
    o.runtime.microbatch_size = choose_generate_microbatch(o.runtime, request, grid, o.model,
                                                           world.size() / std::max(o.runtime.sequence_parallel, 1),
                                                           this_rank_device, world.is_coordinator());
  // Which rank runs CLIP, T5 and the VAE, checked here, before any weight is read: a map that names a GPU past
  // the world is refused naming the component. The rank that decodes checks the VAE's activations.
  const auto components = runtime::plan_components(flux.folder(), o.runtime.pipeline_device_map,
                                                   o.runtime.max_memory, request.dtype, world.size(),
                                                   o.runtime.sequence_parallel);
  check_memory(request, dtype, flux, decode && world.rank() == components.vae.rank, this_rank_device,
               o.runtime.microbatch_size);
  mark_work_started();  // a failure from here on is a runtime error (exit 1), before it an input error (3)
  DP_INFO("generate: ", request.prompts.size(), " prompt(s) x ", request.num_images_per_prompt, " image(s), ",
          grid.image_width(), "x", grid.image_height(), ", ", request.steps, " steps, guidance ", request.guidance, ", seed ",
          request.seed, ", ", dtype, " on ", o.device, given_options.device == "auto" ? " (--device auto)" : "",
          ", device map ", o.runtime.device_map.empty() ? "pipeline (the default)" : o.runtime.device_map);
  const auto started = std::chrono::steady_clock::now();
  std::vector<double> step_ends;
  std::vector<std::string> written;
  runtime::Outputs outputs;
  outputs.on_step = [&step_ends, &request](const pipeline::LoopProgress& p) {
    step_ends.push_back(p.elapsed_seconds);
    const double per_step = p.elapsed_seconds / p.step;
    const double images_per_second = p.elapsed_seconds > 0 ? request.batch() * p.step / (p.steps * p.elapsed_seconds) : 0;
    // Microbatches run a few at a time: this is work done in units of one step of every image, not a step.
    DP_INFO("progress ", p.step, "/", p.steps, " (", p.images_done, "/", request.batch(), " images done): ",
            human_seconds(per_step), " per step of every image, ", std::setprecision(3), images_per_second,
            " images/s, ", human_seconds(p.elapsed_seconds), " elapsed, ", human_seconds(per_step * (p.steps - p.step)),
            " left");
  };
  if (decode) {
    // Called as each microbatch's images arrive, so that a job that dies keeps what it finished.
    outputs.on_images = [&](int64_t first_row, const at::Tensor& images, int decoded_on) {
      for (int64_t i = 0; i < images.size(0); ++i) {
        const at::Tensor image = images[i].contiguous();
        std::vector<uint8_t> pixels(image.data_ptr<uint8_t>(), image.data_ptr<uint8_t>() + image.numel());
        const int64_t index = first_row + i;
        DP_CHECK(index >= 0 && index < static_cast<int64_t>(out_paths.size()), "image ", index, " of a batch of ",
                 out_paths.size());
        written.push_back(out_paths[static_cast<size_t>(index)]);
        io::write_png_rgb(written.back(), pixels, static_cast<int>(image.size(1)), static_cast<int>(image.size(0)),
                          png_text_for(image_settings(request, index, o.model, dtype)));
        DP_INFO("wrote ", written.back(), " (image ", index, ", decoded on rank ", decoded_on, ")");
      }
    };
  } else {
    outputs.on_latents = [&](const at::Tensor& latents) {
      const at::Tensor values = latents.to(at::kCPU, at::kFloat).contiguous();
      io::LatentsFile file;
      file.shape = values.sizes().vec();
      file.values.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
      file.numeric_attributes = {{"height", static_cast<double>(request.height)},
                                 {"width", static_cast<double>(request.width)},
                                 {"seed", static_cast<double>(request.seed)},
                                 {"steps", static_cast<double>(request.steps)},
                                 {"guidance", request.guidance},
                                 {"num_images_per_prompt", static_cast<double>(request.num_images_per_prompt)}};
      file.text_attributes = {{"dtype", dtype}, {"model", o.model}};
      io::write_latents_hdf5(out_paths.front(), file);
      written.push_back(out_paths.front());
    };
  }
  o.runtime.warm_up = !o.no_warm_up;
  const auto outcome = runtime::distributed_generate(flux, request, grid, o.runtime, outputs);
  if (outcome.stopped) {
    // Every rank exits with the code batch scripts requeue on; mpirun passes it on.
    command_exit_code() = runtime::kExitCheckpointedAndStopped;
    if (world.is_coordinator())
      std::cout << "stopped by a signal: checkpoint " << outcome.checkpoint << " written; resume with --resume "
                << checkpoints.dir << " (exit " << runtime::kExitCheckpointedAndStopped << ")\n";
    return;
  }
  if (!runtime::World::get().is_coordinator()) return;  // rank 0 reports and writes

  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "timing summary (" << std::fixed << std::setprecision(2) << total << " s total):\n";
  for (const auto& stage : flux.reports()) {
    std::cout << "  " << std::left << std::setw(8) << stage.name << std::right << std::setw(9) << stage.seconds
              << " s   (loading " << std::setw(6) << stage.load_seconds << " s)   peak RSS "
              << human_bytes(stage.peak_resident_bytes);
    if (stage.peak_device_bytes > 0) std::cout << ", peak device " << human_bytes(stage.peak_device_bytes);
    std::cout << "\n";
  }
  for (const auto& path : written) std::cout << "wrote " << path << "\n";
  if (!o.report_json.empty()) {
    write_report_json(o, dtype, request, grid, flux.reports(), step_ends, total);
    std::cout << "wrote " << o.report_json << "\n";
  }
}

CommandRegistrar registrar("generate", 10, [](CLI::App& root) {
  using Request = pipeline::GenerateRequest;
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = root.add_subcommand("generate", kGenerateSummary);
  cmd->add_option("--config", o->config,
                  "a JSON run config (configs/*.json): its keys are these flags' long names (\"steps\": 50, "
                  "\"device-map\": \"auto\", \"prompt\": [\"a\", \"b\"]); flags on the command line override them. "
                  "An unknown key or a value of the wrong type is an error naming the key and the file");
  cmd->add_option("--ranks", o->ranks,
                  "the number of ranks this run needs (a config states it); checked against the MPI world before "
                  "anything loads (0: any)")
      ->capture_default_str();
  cmd->add_option("--model", o->model,
                  "diffusers FLUX pipeline folder (model_index.json and components), or a Hugging Face model id "
                  "(black-forest-labs/FLUX.1-dev) already in the local cache (HF_HUB_CACHE, HF_HOME/hub or "
                  "~/.cache/huggingface/hub; nothing is downloaded)")
      ->required();
  cmd->add_flag("--dry-run", o->dry_run,
                "check the request, every path and the model folder's components, print what would run and exit, "
                "without a device or loading any weight");
  cmd->add_option("--revision", o->revision,
                  "with a model id: the branch, tag or commit of the cached snapshot (default: main)");
  cmd->add_option("--prompt", o->prompts,
                  "one prompt (quote it when it has spaces: --prompt \"a cat on a mat\"); repeat for several")
      ->allow_extra_args(false);
  // Catches the words of an unquoted prompt, so that they are refused with a hint instead of becoming prompts.
  cmd->add_option("stray-words", o->stray_words)->group("");
  cmd->add_option("--prompts-file", o->prompts_file,
                  "file with one prompt a line (blank lines skipped); with --lora-mode unfused a line (or a --prompt) "
                  "may start with <lora:NAME> or <lora:NAME:SCALE> tags choosing its adapters (<lora:none>: none)");
  cmd->add_option("--num-images-per-prompt", o->num_images_per_prompt,
                  str("images per prompt; at most ", Request::kMaxImages, " images per run (prompts x this)"))
      ->capture_default_str();
  cmd->add_option("--height", o->height,
                  "image height in pixels (default: from the model, 128 x the VAE's scale factor: 1024 for FLUX.1); "
                  "a multiple of 2 x that factor (16 for FLUX.1), else rounded down with a warning, as diffusers; "
                  + str("at most ", Request::kMaxImageSide));
  cmd->add_option("--width", o->width, "image width in pixels (default, rounding and limit as --height)");
  cmd->add_option("--steps,--num-inference-steps", o->steps,
                  str("denoising steps, 1 to ", Request::kMaxSteps, " (--num-inference-steps: diffusers' name)"))->capture_default_str();
  cmd->add_option("--guidance,--guidance-scale", o->guidance,
                  "guidance scale, a finite number (used when the transformer has a guidance embedding; "
                  "--guidance-scale: diffusers' name)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the CPU generator that draws the initial latents")->capture_default_str();
  cmd->add_option("--max-sequence-length", o->max_sequence_length, "T5 tokens, at most 512")->capture_default_str();
  cmd->add_option("--dtype,--torch-dtype", o->dtype,
                  "fp32, bf16 or fp16 (also as torch names: torch.bfloat16, bfloat16, float16, float32); default fp32 on cpu (bf16 is many times slower there), bf16 on cuda");
  cmd->add_option("--device", o->device, "auto (cuda when a GPU is visible, else cpu), cpu or cuda")
      ->capture_default_str();
  cmd->add_option("--out", o->out,
                  "output path, default out.png (out.h5 with --output-type latent); its extension must match "
                  "--output-type. Several images are written as PATH-0.png, PATH-1.png ... (all images of the first "
                  "prompt first). A regular file or a new one (never through a symbolic link: a link is refused); "
                  "/dev/null discards them all; a FIFO or other device is refused");
  cmd->add_option("--output-type", o->output_type,
                  "png (or pil, diffusers' name for it), or latent: packed latents (B, seq, 64) float32 in an HDF5 file, "
                  "dataset 'latents'")
      ->capture_default_str();
  cmd->add_option("--report-json", o->report_json,
                  "also write per-stage times (with the part spent loading weights), peak memory and step times "
                  "as JSON to this file");
  cmd->add_option("--device-map", o->runtime.device_map,
                  "how the transformer's blocks are split over the ranks (GPU d of the map is rank d): auto, "
                  "balanced, balanced_low_0, sequential, pipeline or a JSON map, as `plan` takes it (default: "
                  "pipeline, the time-balanced split over all ranks)");
  cmd->add_option("--max-memory", o->runtime.max_memory,
                  "memory per device for planning, as `plan` takes it (0=16GB,1=16GB,cpu=64GB or a JSON file)");
  cmd->add_option("--load-overlap", o->runtime.load_overlap,
                  "load this rank's transformer blocks on a thread while its text encoders run: on, off, or auto "
                  "(today the staged order: overlapping measured slower on an H200; the log says which and why)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--no-warm-up", o->no_warm_up,
                "skip running one transformer block of each kind on zeros after loading (it readies the kernels and "
                "cuBLAS handles, so that the first denoising step costs what later ones do)");
  cmd->add_option("--pipeline-device-map", o->runtime.pipeline_device_map,
                  "which ranks run CLIP, T5 and the VAE: only \"balanced\", diffusers' pipeline-level map, placed with "
                  "--max-memory as `plan --pipeline-device-map balanced --components text_encoder,text_encoder_2,vae` "
                  "shows it (GPU d is rank d; \"cpu\" is the coordinator on its CPU). Default: rank 0 runs all three");
  cmd->add_option("--microbatch-size", o->runtime.microbatch_size,
                  "images per microbatch in the denoising ring; with several microbatches every rank is busy "
                  "(latents equal for any world size at the same microbatch size). 0: choose the size with the most "
                  "simulated images/s for the images, ranks and --max-memory, from the calibration's times and "
                  "microbatch efficiency curve when one matches (else FLOP-scaled times and a stated default curve); "
                  "the log says which and why")
      ->capture_default_str();
  cmd->add_option("--calibration", o->runtime.calibration,
                  "block times written by `diffpipe calibrate`: the \"pipeline\" split is planned from them when an "
                  "entry matches this run (each rank's device name, dtype, size, text tokens, microbatch size); "
                  "otherwise from FLOP-scaled times, and the log says why (default: " +
                      placement::default_calibration_path() + " when it exists)");
  cmd->add_flag("--calibrate-on-load", o->runtime.calibrate_on_load,
                "before the ranks load their blocks, rank 0 times one double and one single block, the embedders and "
                "the output layers on its device at this run's shape and microbatch size (at most 2 s), and every "
                "rank re-plans the \"pipeline\" split from those times (replacing any --calibration) and agrees on it");
  cmd->add_flag("--no-calibration", o->runtime.no_calibration,
                "plan the \"pipeline\" split from FLOP-scaled times even when a calibration matches");
  cmd->add_option("--sequence-parallel", o->runtime.sequence_parallel,
                  "K ranks per pipeline stage that split each image's text and image tokens (Ulysses: an all-to-all "
                  "around every attention, exact). The world is a mesh of S stage groups x K ranks (world size = "
                  "S x K, rank = group x K + k); --device-map, --max-memory and --pipeline-device-map plan the S groups "
                  "(GPU d is group d). K must divide the world and the transformer's attention heads and leave every "
                  "rank a token; a refusal names the valid values. 1: the plain pipeline ring")
      ->capture_default_str();
  cmd->add_option("--transport-timeout", o->runtime.transport_timeout_seconds,
                  "seconds a rank waits for any one message before it ends the job (a dead or unreachable rank); a "
                  "positive, finite number")
      ->capture_default_str();
  cmd->add_option("--transport", o->runtime.transport,
                  "how activations move between ranks: nccl (GPU to GPU with NCCL on a stream of their own, "
                  "--device cuda only, in a build with NCCL), mpi (staged through host memory; CPU runs, CI) or "
                  "auto (nccl when the device is cuda, this build has NCCL and there are several ranks; else mpi). "
                  "Control messages always go over MPI; every rank must choose the same")
      ->capture_default_str();
  add_trace_option(*cmd, o->runtime);
  cmd->add_option("--report", o->runtime.report_path,
                  "each rank writes its figures as JSON (rank, transport, blocks, load time, peak memory, bytes to "
                  "and from its neighbours, compute/receive/send/idle seconds in total and per step; on cuda compute "
                  "is device time from CUDA events, and so are send/receive over nccl); with N > 1 ranks beside PATH "
                  "as PATH.rankR.json");
  cmd->add_option("--checkpoint-dir", o->runtime.checkpoints.dir,
                  "write denoising checkpoints (HDF5, atomically) into this directory as checkpoint-stepNNNNNN-RUNID.h5: "
                  "every --checkpoint-every steps, and on SIGUSR1 or SIGTERM to any rank at the next step boundary, "
                  "after which every rank stops with exit status 75. A directory holding another run's checkpoints "
                  "is refused unless --resume or --share-checkpoint-dir");
  cmd->add_option("--checkpoint-every", o->runtime.checkpoints.every,
                  "steps between checkpoints (0: only on a stop signal)")->capture_default_str();
  cmd->add_option("--keep-checkpoints", o->runtime.checkpoints.keep,
                  "keep the newest N checkpoints of this run (older ones of this run are removed, each logged; other "
                  "runs' files never are)")
      ->capture_default_str();
  cmd->add_flag("--share-checkpoint-dir", o->runtime.checkpoints.share_dir,
                "let --checkpoint-dir hold other runs' checkpoints: this run writes beside them under its own run "
                "id and never replaces or removes theirs (without it such a directory is refused, unless --resume)");
  cmd->add_option("--resume", o->resume,
                  "continue from a checkpoint file, or a directory: the newest valid checkpoint of the one run there "
                  "that this request matches (same model, and the options given); several matching runs are listed "
                  "and refused. Options not given are taken from it, those given must match it (any world size and "
                  "device map)");
  add_generate_input_options(*cmd, o->inputs);
  cmd->add_option("--embeddings-cache", o->runtime.checkpoints.embeddings_cache,
                  "HDF5 file of prompt embeddings keyed by prompt, max sequence length, dtype and the text "
                  "encoders' fingerprint: prompts found there skip CLIP and T5, new ones are added. Only a new file "
                  "or a cache diffpipe wrote is (re)written; any other file is refused");
  cmd->callback([o, cmd] {
    for (const auto& [flag, field] : std::vector<std::pair<std::string, std::string>>{
             {"--prompt", "prompts"}, {"--prompts-file", "prompts"}, {"--num-images-per-prompt", "num-images-per-prompt"},
             {"--height", "height"}, {"--width", "width"}, {"--steps", "steps"}, {"--guidance", "guidance"},
             {"--seed", "seed"}, {"--max-sequence-length", "max-sequence-length"}, {"--dtype", "dtype"},
             {"--microbatch-size", "microbatch-size"}})
      if (cmd->count(flag) > 0) o->given.push_back(field);
    for (const auto& field : given_input_options(*cmd)) o->given.push_back(field);
    // MPI starts before anything is checked, so that a bad input on any rank ends every rank with a message.
    const auto& world = runtime::World::init(nullptr, nullptr);
    world.run_guarded([&] {
      check_world_size(*o, world);
      run_reporting_torch_errors([&] { generate_on_this_rank(*o); });
    });
  });
  cmd->footer(
      "Checked before any work: every path (outputs writable regular files or new ones, never through a\n"
      "symbolic link; no FIFO or device but /dev/null; no two of the run's paths one file; nothing written into\n"
      "the model folder; the embeddings cache a cache; no other run's checkpoints in --checkpoint-dir), the\n"
      "limits above, and the memory the activations need (estimated from the configs) against what the device\n"
      "has free. Files are written whole (a temporary renamed over the name) or not at all; a full disk is\n"
      "named (ENOSPC, EDQUOT).\n\n"
      "Exit status: 0 done; 1 runtime error (the work started and failed); 2 usage error (the command line\n"
      "cannot be parsed); 3 input error (refused before any work: a bad folder, file or value, not enough\n"
      "memory); 75 (EX_TEMPFAIL) stopped by SIGUSR1/SIGTERM (to any rank) after writing a checkpoint into\n"
      "--checkpoint-dir (every rank; mpirun too for SIGUSR1, while Open MPI's mpirun exits 1 on its own\n"
      "SIGTERM): requeue the job with --resume DIR.");
});

}  // namespace
}  // namespace dp::cli
