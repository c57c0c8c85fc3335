// `diffpipe generate`: the whole FLUX pipeline in one process, with diffusers' defaults and numbers. Its options
// are in generate_options.cpp, the checks of a request in generate_checks.cpp; this file runs it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/format.h"
#include "cli/generate_checks.h"
#include "cli/generate_inputs.h"
#include "cli/generate_microbatch.h"
#include "cli/generate_options.h"
#include "cli/generate_paths.h"
#include "cli/png_metadata.h"
#include "cli/torch_boundary.h"
#include "core/cpu_affinity.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/human_units.h"
#include "core/json_file.h"
#include "core/log.h"
#include "core/output_policy.h"
#include "core/process_clock.h"
#include "io/checkpoint_dir.h"
#include "io/hdf5_latents.h"
#include "io/hub_cache.h"
#include "io/parallel_load.h"
#include "io/png_image.h"
#include "io/run_dtype.h"
#include "io/torch_tensors.h"
#include "models/flux/fp8_gemm.h"
#include "placement/mesh.h"
#include "runtime/components.h"
#include "runtime/distributed_generate.h"
#include "runtime/world.h"

namespace dp::cli {
namespace {

// --transport-timeout's ceiling: a wait of more than a few months is a typo, not a plan.
constexpr double kMaxTransportTimeout = 1e7;

// /dev/null takes every image in place, rather than out-0.png, out-1.png ... beside it (in /dev). Every other
// non-regular target is refused by the output policy (core/output_policy.h).
bool writes_in_place(const std::string& path) { return is_dev_null(path); }

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
                        // Process start to main() (LibTorch's and CUDA's libraries), and to the outputs on disk.
                        {"process_start_to_main_seconds", age_at_main_seconds()},
                        {"process_start_to_outputs_seconds", process_age_seconds()},
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
    paths.torch_profile = o.runtime.torch_profile_path;
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
  io::check_load_environment();
  request.device = usable_device(o.device);
  const at::Device this_rank_device = runtime::rank_device(request.device, world);
  // A GPU rank bound to a core or two loads its weights at a fraction of its link's rate; said before any loads.
  if (this_rank_device.is_cuda()) {
    const std::string binding = io::cpu_binding_warning(usable_cpus(), machine_cpus());
    if (!binding.empty()) DP_WARN(binding);
  }
  // The context and the pinned staging on a thread, beside the folder's checks and the plans below (the memory
  // check's first CUDA call waits for the context).
  const std::future<void> device_opened = open_device_in_background(this_rank_device);

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
  const auto memory_check_started = std::chrono::steady_clock::now();
  check_memory(request, dtype, flux, decode && world.rank() == components.vae.rank, this_rank_device,
               o.runtime.microbatch_size);
  DP_DEBUG("memory check on ", this_rank_device.str(), " (the CUDA context's creation included): ",
           human_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - memory_check_started).count()));
  // The text encoders' first-use cost, paid on a thread beside the rest of the start (FluxPipeline::
  // start_encoder_warm_up), for the encoders this rank runs on its GPU, unless --no-warm-up or a memory cap
  // without room for the warm-up beside their weights. After the memory check, which must not count them.
  if (!checkpoints.resume && !o.no_warm_up && this_rank_device.is_cuda()) {
    const int gpu = world.rank() / std::max(o.runtime.sequence_parallel, 1);  // GPU d of --max-memory: group d
    const auto warm = runtime::plan_encoder_warm_up(
        components, flux.folder(), o.runtime.max_memory, request.dtype, world.rank(), gpu,
        std::min<int64_t>(static_cast<int64_t>(request.encode_texts().size()), pipeline::FluxPipeline::kEncodeChunk),
        request.max_sequence_length);
    if (!warm.reason.empty()) DP_INFO("rank ", world.rank(), ": text encoders' warm-up ", warm.reason);
    flux.start_encoder_warm_up(request, this_rank_device, warm.clip, warm.t5);
  }
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
  if (age_at_main_seconds() >= 0)
    std::cout << "  startup  " << std::setw(9) << age_at_main_seconds()
              << " s   (process start to main(): loading LibTorch's and CUDA's libraries)\n";
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
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = root.add_subcommand("generate", kGenerateSummary);
  add_generate_options(*cmd, *o);
  cmd->callback([o, cmd] {
    for (const auto& [flag, field] : std::vector<std::pair<std::string, std::string>>{
             {"--prompt", "prompts"}, {"--prompts-file", "prompts"}, {"--num-images-per-prompt", "num-images-per-prompt"},
             {"--height", "height"}, {"--width", "width"}, {"--steps", "steps"}, {"--guidance", "guidance"},
             {"--seed", "seed"}, {"--max-sequence-length", "max-sequence-length"}, {"--dtype", "dtype"},
             {"--microbatch-size", "microbatch-size"}})
      if (cmd->count(flag) > 0) o->given.push_back(field);
    for (const auto& field : given_input_options(*cmd)) o->given.push_back(field);
    // DIFFPIPE_FP8_GEMMS=1 counts as the flag: --resume compares either with what the checkpoint recorded.
    if (o->runtime.fp8_gemms || models::flux::fp8_gemms_enabled()) {
      o->runtime.fp8_gemms = true;
      o->given.push_back("fp8-gemms");
    }
    // MPI starts before anything is checked, so that a bad input on any rank ends every rank with a message.
    const auto& world = runtime::World::init(nullptr, nullptr);
    // A single process's error reaches main(), which prints it and then ends the process here too.
    end_after_command_error() = [](int code) { runtime::World::end_process(code); };
    world.run_guarded([&] {
      check_world_size(*o, world);
      run_reporting_torch_errors([&] { generate_on_this_rank(*o); });
    });
    // The images, latents, checkpoints and reports are closed on disk: the teardown is not the user's wait.
    runtime::World::end_process(command_exit_code());
  });
});

}  // namespace
}  // namespace dp::cli
