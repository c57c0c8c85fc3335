#include "runtime/distributed_generate.h"

#include <c10/core/InferenceMode.h>
#include <torch/headeronly/version.h>

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "core/memory_stats.h"
#include "io/run_dtype.h"
#include "io/torch_tensors.h"
#include "io/weight_index.h"
#include "models/flux/flux_config.h"
#include "pipeline/denoise_loop.h"
#include "pipeline/finite_check.h"
#include "pipeline/device_stats.h"
#include "pipeline/flux_stage.h"
#include "pipeline/stage_timer.h"
#include "placement/plan.h"
#include "placement/ring_stages.h"
#include "runtime/mpi_transport.h"
#include "runtime/ring.h"
#include "runtime/world.h"

#ifndef DIFFPIPE_GIT_REVISION
#define DIFFPIPE_GIT_REVISION "unknown"
#endif

namespace dp::runtime {
namespace {

namespace fs = std::filesystem;

// FNV-1a, 64 bit: a stable fingerprint, not a security measure.
struct Fnv {
  uint64_t hash = 0xcbf29ce484222325ULL;
  void add(const std::string& text) {
    for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ULL;
    hash = (hash ^ 0xff) * 0x100000001b3ULL;  // separator, so "ab"+"c" differs from "a"+"bc"
  }
  std::string hex() const {
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(hash));
    return out;
  }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DP_CHECK(in.good(), path, ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The split every rank computes from the same headers.
struct Plan {
  nlohmann::ordered_json hf_device_map;
  std::vector<placement::RankStage> stages;
  std::string digest;
};

Plan plan_transformer(const pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                      const pipeline::LatentGrid& grid, const RuntimeOptions& options, int world_size) {
  placement::PlanRequest plan_request;
  plan_request.model_dir = flux.folder().dir();
  plan_request.device_map = options.device_map.empty() ? "pipeline" : options.device_map;
  if (!options.max_memory.empty()) plan_request.max_memory = placement::read_max_memory_argument(options.max_memory);
  plan_request.world_size = world_size;
  plan_request.dtype = io::to_safetensors_dtype(request.dtype);
  // The size the run computes (rounded as diffusers rounds it), in FLUX.1's 16-pixel units for the timing model.
  plan_request.timing.height = grid.height / 2 * 16;
  plan_request.timing.width = grid.width / 2 * 16;
  plan_request.timing.batch = options.microbatch_size;
  plan_request.timing.text_tokens = request.max_sequence_length;
  const auto plan = placement::make_plan(plan_request);
  const std::string config_path = flux.folder().component("transformer").path + "/config.json";
  const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
  Plan out;
  out.hf_device_map = plan.at("hf_device_map");
  out.stages = placement::ring_stages(out.hf_device_map, config, world_size);
  Fnv fnv;
  fnv.add(out.hf_device_map.dump());
  for (const auto& s : out.stages) fnv.add(str(s.rank, ":", s.first_block, "-", s.last_block));
  out.digest = plan_request.device_map + " " + fnv.hex();
  return out;
}

// What every rank must have been asked to do, in a readable form when short.
std::string request_digest(const pipeline::GenerateRequest& request, const RuntimeOptions& options) {
  Fnv prompts;
  for (const auto& p : request.prompts) prompts.add(p);
  return str(request.prompts.size(), " prompts (", prompts.hex(), ") x ", request.num_images_per_prompt, ", ",
             request.width, "x", request.height, ", ", request.steps, " steps, seed ", request.seed, ", guidance ",
             request.guidance, ", ", io::run_dtype_name(request.dtype), ", ", request.max_sequence_length,
             " tokens, microbatch ", options.microbatch_size, ", device ", request.device.type() == at::kCUDA ? "cuda" : "cpu");
}

std::string describe_stages(const std::vector<placement::RankStage>& stages) {
  std::string text;
  for (const auto& s : stages) text += str(text.empty() ? "" : ", ", "rank ", s.rank, " blocks [", s.first_block, ", ", s.last_block, ")");
  return text;
}

std::string rank_report_path(const std::string& path, const World& world) {
  if (world.size() == 1) return path;
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + ".rank" + std::to_string(world.rank()) + p.extension().string())).string();
}

// --report: what this rank did in the denoising phase, per step, with its boundaries' traffic.
void write_rank_report(const RuntimeOptions& options, const World& world, const RingLayout& layout,
                       const at::Device& device, const RankTimes& times, double load_seconds, uint64_t load_bytes,
                       const Transport* transport) {
  if (options.report_path.empty()) return;
  const placement::RankStage* stage = layout.stage_of(world.rank());
  nlohmann::ordered_json doc = {
      {"rank", world.rank()},
      {"world_size", world.size()},
      {"host", world.host()},
      {"local_rank", world.local_rank()},
      {"device", device.str()},
      {"role", world.is_coordinator() ? (stage ? "coordinator and stage" : "coordinator") : (stage ? "stage" : "idle")},
      {"blocks", stage ? nlohmann::ordered_json::array({stage->first_block, stage->last_block}) : nlohmann::ordered_json()},
      {"load_seconds", load_seconds},
      {"load_bytes", load_bytes},
      {"load_gb_per_s", load_seconds > 0 ? load_bytes / 1e9 / load_seconds : 0.0},
      {"peak_resident_bytes", peak_resident_bytes()},
      {"peak_device_bytes", device.is_cuda() ? pipeline::peak_memory_bytes(device) : 0},
      {"receives_from", world.is_coordinator() ? layout.last_rank() : layout.previous(world.rank())},
      {"sends_to", world.is_coordinator() ? (layout.coordinator_runs_first_stage() ? layout.next(0) : layout.first_rank())
                                          : layout.next(world.rank())},
      {"bytes_sent", transport ? transport->bytes_sent() : 0},
      {"bytes_received", transport ? transport->bytes_received() : 0},
      {"denoise_wall_seconds", times.wall_seconds},
      {"compute_seconds", times.compute_seconds},
      {"receive_seconds", times.wait_seconds},
      {"send_seconds", times.send_seconds},
      {"idle_seconds", std::max(0.0, times.wall_seconds - times.compute_seconds - times.wait_seconds - times.send_seconds)},
      {"microbatch_steps", times.steps}};
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (size_t s = 0; s < times.per_step.size(); ++s) {
    const auto& step = times.per_step[s];
    steps.push_back({{"step", s + 1}, {"microbatches", step.microbatches}, {"compute_seconds", step.compute_seconds},
                     {"receive_seconds", step.receive_seconds}, {"send_seconds", step.send_seconds}});
  }
  doc["per_step"] = steps;
  const std::string path = rank_report_path(options.report_path, world);
  write_json_file(path, doc);
  DP_INFO("rank ", world.rank(), ": wrote ", path);
}

// --max-memory holds at run time too: this rank's CUDA caching allocator may not grow past its GPU's entry, so
// two ranks capped at 16 GB on one H200 behave like the seed's two 16 GB cards. An allocation past the cap fails
// with LibTorch's out-of-memory error, which names the cap; run_guarded adds the rank.
void cap_device_memory(const RuntimeOptions& options, const World& world, const at::Device& device) {
  if (options.max_memory.empty() || !device.is_cuda()) return;
  const auto caps = placement::read_max_memory_argument(options.max_memory);
  const auto gpu = placement::Device::gpu(world.rank());
  if (!caps.has(gpu)) return;
#ifdef DIFFPIPE_HAVE_CUDA
  // The allocator sizes its per-device tables on first use; the cap must come after that.
  at::globalContext().lazyInitDevice(at::kCUDA);
  const auto total = static_cast<double>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
  const double fraction = std::min(1.0, static_cast<double>(caps.at(gpu)) / total);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
  DP_INFO("rank ", world.rank(), ": CUDA allocator capped at ", caps.at(gpu) / 1e9, " GB (", std::fixed,
          std::setprecision(3), fraction, " of ", total / 1e9, " GB)");
#else
  DP_FAIL("this build has no CUDA support");
#endif
}

}  // namespace

at::Device rank_device(const at::Device& requested, const World& world) {
  if (!requested.is_cuda()) return requested;
#ifdef DIFFPIPE_HAVE_CUDA
  const int visible = static_cast<int>(at::cuda::device_count());
  DP_CHECK(visible > 0, "--device cuda, but rank ", world.rank(), " on ", world.host(), " sees no CUDA device");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank() % visible));
#else
  DP_FAIL("--device cuda: this build has no CUDA support");
#endif
}

namespace {

GenerateOutcome run_ranks(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                          const pipeline::LatentGrid& grid, const RuntimeOptions& options, const Outputs& outputs,
                          World& world, std::unique_ptr<Transport>& transport) {
  c10::InferenceMode guard;
  if (world.is_coordinator())
    DP_INFO("runtime: ", world.size(), " rank(s); ", world.uses_mpi() ? world.mpi_version() : "no MPI launcher",
            "; LibTorch ", TORCH_VERSION, "; build ", build_id());
  world.agree("diffpipe build", build_id(), options.transport_timeout_seconds);
  world.agree("request (prompts, size, steps, seed, guidance, dtype, microbatch size)",
              request_digest(request, options), options.transport_timeout_seconds);
  const std::string transformer_dir = flux.folder().component("transformer").path;
  const std::string fingerprint = model_fingerprint(transformer_dir);
  world.agree("model fingerprint (transformer config and tensor headers)", fingerprint,
              options.transport_timeout_seconds);
  const auto& checkpoints = options.checkpoints;
  world.agree("checkpoint to resume from", checkpoints.resume ? checkpoints.resume_path : "(none)",
              options.transport_timeout_seconds);
  const Plan plan = plan_transformer(flux, request, grid, options, world.size());
  world.agree("plan (device map and block ranges)", plan.digest, options.transport_timeout_seconds);
  const RingLayout layout(plan.stages, world.size());
  if (world.is_coordinator()) DP_INFO("runtime: ring ", describe_stages(plan.stages), "; hf_device_map ", plan.hf_device_map.dump());
  if (world.uses_mpi()) transport = std::make_unique<MpiTransport>(world.rank(), world.size(), options.transport_timeout_seconds);

  const at::Device device = rank_device(request.device, world);
  cap_device_memory(options, world, device);
  const placement::RankStage* mine = layout.stage_of(world.rank());
  double load_seconds = 0;
  uint64_t load_bytes = 0;
  const auto load_stage = [&]() -> std::shared_ptr<pipeline::FluxStage> {
    if (mine == nullptr) return nullptr;
    const auto started = std::chrono::steady_clock::now();
    auto stage = std::make_shared<pipeline::FluxStage>(transformer_dir, mine->first_block, mine->last_block,
                                                       request.dtype, device, grid, request.max_sequence_length);
    load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    load_bytes = stage->weight_bytes();
    DP_INFO("rank ", world.rank(), ": loaded blocks [", mine->first_block, ", ", mine->last_block, "): ", std::fixed,
            std::setprecision(1), load_bytes / 1e6, " MB in ", std::setprecision(2), load_seconds, " s (",
            std::setprecision(3), load_seconds > 0 ? load_bytes / 1e9 / load_seconds : 0.0, " GB/s)");
    return stage;
  };

  if (!world.is_coordinator()) {
    auto stage = load_stage();  // while rank 0 encodes the prompts
    const RankTimes times = run_stage_worker(world.rank(), layout, *transport, stage.get());
    DP_INFO("rank ", world.rank(), ": ", times.steps, " microbatch steps, ", std::fixed, std::setprecision(2),
            times.compute_seconds, " s computing, ", times.wait_seconds, " s waiting; ",
            transport->bytes_sent() / 1e6, " MB sent, ", transport->bytes_received() / 1e6, " MB received");
    write_rank_report(options, world, layout, device, times, load_seconds, load_bytes, transport.get());
    GenerateOutcome outcome;
    outcome.stopped = world.share_from_coordinator(0, options.transport_timeout_seconds) != 0;
    return outcome;
  }

  // The coordinator: encode (or take the checkpoint's embeddings), then its own stage, then the ring.
  pipeline::PromptEmbeddings prompts;
  at::Tensor latents;
  if (checkpoints.resume) {
    const auto& c = *checkpoints.resume;
    prompts.prompt_embeds = from_raw(c.prompt_embeds, request.device);
    prompts.pooled = from_raw(c.pooled, request.device);
    latents = from_raw(c.latents, request.device);
    DP_INFO("resume: ", checkpoints.resume_path, ": ", c.steps_done(), "/", c.run.steps,
            " steps done (slowest image); prompt embeddings from the checkpoint, no text encoder runs");
  } else {
    prompts = encode_prompts_cached(flux, request, checkpoints.embeddings_cache);
    latents = flux.initial_latents(request, grid);
  }
  at::Tensor final_latents;
  GenerateOutcome outcome;
  {
    pipeline::StageTimer timer("denoise", device, flux.report_sink());
    auto stage = timer.loading("transformer load", load_stage);
    const pipeline::DenoiseSchedule schedule = flux.schedule(request, latents.size(1));
    RingExecutor executor(layout, transport.get(), stage);
    pipeline::DenoiseJob job;
    job.latents = latents;
    job.prompt_embeds = prompts.prompt_embeds;
    job.pooled = prompts.pooled;
    job.guidance = request.guidance;
    job.guidance_embeds = schedule.guidance_embeds;
    job.microbatch_size = options.microbatch_size;
    job.scheduler = &schedule.scheduler;
    if (checkpoints.resume) {
      const auto& c = *checkpoints.resume;
      // Same options and model give the same schedule; a difference means another scheduler config.
      DP_CHECK(c.sigmas == schedule.scheduler.sigmas() && c.timesteps == schedule.scheduler.timesteps(),
               checkpoints.resume_path, ": the checkpoint's sigma/timestep schedule differs from the one this run "
               "computes (another scheduler config or diffpipe version?)");
      DP_CHECK(c.latents.shape == latents.sizes().vec(), checkpoints.resume_path, ": latents of shape ",
               latents.sizes(), " expected for this model and size");
      job.start_steps = c.image_steps;
    }
    io::Checkpoint base;
    if (!checkpoints.dir.empty()) {
      base.run.prompts = request.prompts;
      base.run.num_images_per_prompt = request.num_images_per_prompt;
      base.run.height = request.height;
      base.run.width = request.width;
      base.run.steps = request.steps;
      base.run.guidance = request.guidance;
      base.run.seed = request.seed;
      base.run.max_sequence_length = request.max_sequence_length;
      base.run.dtype = io::run_dtype_name(request.dtype);
      base.run.microbatch_size = options.microbatch_size;
      base.model_dir = fs::absolute(flux.folder().dir()).string();
      base.model_fingerprint = fingerprint;
      base.device_map = plan.digest + " " + plan.hf_device_map.dump();
      base.world_size = world.size();
      base.written_by = build_id();
      base.sigmas = schedule.scheduler.sigmas();
      base.timesteps = schedule.scheduler.timesteps();
      // Written with every checkpoint, copied to the CPU once.
      base.prompt_embeds = checkpoints.resume ? checkpoints.resume->prompt_embeds : to_raw(prompts.prompt_embeds);
      base.pooled = checkpoints.resume ? checkpoints.resume->pooled : to_raw(prompts.pooled);
    }
    Checkpointer checkpointer(checkpoints, std::move(base));
    pipeline::LoopCallbacks callbacks;
    if (!checkpoints.dir.empty())
      callbacks.at_boundary = [&checkpointer](const pipeline::LoopState& state) { return checkpointer.at_boundary(state); };
    // NaN weights or an overflow give an all-black image with exit 0 unless a step is checked: one reduction each.
    const int steps = schedule.scheduler.num_inference_steps();
    const bool several_microbatches = latents.size(0) > options.microbatch_size;
    callbacks.check_step = [steps, several_microbatches](int64_t microbatch, int step, const at::Tensor& stepped) {
      pipeline::check_step_latents(stepped, {step + 1, steps, several_microbatches ? str("microbatch ", microbatch) : ""});
    };
    if (outputs.on_step) {
      callbacks.on_step = [&](const pipeline::LoopProgress& p) {
        pipeline::synchronize(device);
        outputs.on_step(p);
      };
    }
    const auto began = std::chrono::steady_clock::now();
    final_latents = pipeline::run_denoise_loop(job, executor, callbacks);
    checkpointer.finish();  // the last checkpoint on disk (or its failure) before the ranks stop
    executor.shutdown();
    outcome.stopped = checkpointer.stopped();
    outcome.checkpoint = checkpointer.last_path();
    world.share_from_coordinator(outcome.stopped ? 1 : 0, options.transport_timeout_seconds);
    RankTimes times = executor.times();
    times.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    write_rank_report(options, world, layout, device, times, load_seconds, load_bytes, transport.get());
    if (transport)
      DP_INFO("rank 0: ", executor.times().steps, " microbatch steps computed, ", std::fixed, std::setprecision(2),
              executor.times().wait_seconds, " s waiting for results; ", transport->bytes_sent() / 1e6, " MB sent, ",
              transport->bytes_received() / 1e6, " MB received");
  }  // the coordinator's blocks are released before the VAE loads
  if (outcome.stopped) return outcome;  // the checkpoint holds the state; there is no output yet
  if (outputs.on_latents) outputs.on_latents(final_latents);
  if (outputs.on_images) outputs.on_images(flux.decode(request, grid, final_latents));
  return outcome;
}

}  // namespace

std::string build_id() {
  return str("diffpipe ", DIFFPIPE_VERSION, " git ", DIFFPIPE_GIT_REVISION, " built ", __DATE__, " ", __TIME__);
}

std::string model_fingerprint(const std::string& transformer_dir) {
  Fnv fnv;
  fnv.add(read_text((fs::path(transformer_dir) / "config.json").string()));
  const auto weights = io::WeightIndex::open_dir(transformer_dir);
  for (const auto& name : weights.names()) {
    const auto& info = weights.info(name);
    std::string shape;
    for (int64_t d : info.shape) shape += std::to_string(d) + ",";
    fnv.add(str(name, " ", io::dtype_name(info.dtype), " ", shape, " ", info.nbytes()));
  }
  return fnv.hex();
}

GenerateOutcome distributed_generate(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                                     const pipeline::LatentGrid& grid, const RuntimeOptions& options,
                                     const Outputs& outputs) {
  std::unique_ptr<Transport> transport;
  return run_ranks(flux, request, grid, options, outputs, World::get(), transport);
}

}  // namespace dp::runtime
