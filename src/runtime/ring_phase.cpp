#include "runtime/ring_phase.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <c10/core/DeviceGuard.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <iomanip>

#include "core/error.h"
#include "core/human_units.h"
#include "core/log.h"
#include "io/run_dtype.h"
#include "io/torch_tensors.h"
#include "models/flux/fp8_gemm.h"
#include "pipeline/denoise_loop.h"
#include "pipeline/finite_check.h"
#include "pipeline/phase_guard.h"
#include "pipeline/stage_timer.h"
#include "runtime/checkpointing.h"
#include "runtime/torch_profile.h"
#include "runtime/world.h"

namespace dp::runtime {
namespace {

// What a checkpoint records besides the loop's state: the run, the model, the plan, the schedule, the prompts.
io::Checkpoint checkpoint_base(const RunContext& run, const pipeline::DenoiseSchedule& schedule,
                               const pipeline::PromptEmbeddings& prompts) {
  const auto& request = run.request;
  io::Checkpoint base;
  base.run = checkpoint_run(request, run.options.microbatch_size, models::flux::fp8_gemms_enabled());
  base.model_dir = std::filesystem::absolute(run.flux.folder().dir()).string();
  base.model_fingerprint = run.fingerprint;
  base.device_map = run.plan.digest + " " + run.plan.hf_device_map.dump();
  base.world_size = run.world.size();
  base.written_by = build_id();
  base.sigmas = schedule.scheduler.sigmas();
  base.timesteps = schedule.scheduler.timesteps();
  // Written with every checkpoint, copied to the CPU once.
  record_embeddings(base, prompts);
  return base;
}

// The loop's own kernels (pipeline::warm_up_loop_kernels) loaded on a thread while this one loads the blocks,
// unless --no-warm-up. Meant for CUDA; on the CPU it costs a few small ops and runs so that the tests go through
// the same thread and joins. The thread's device is the run's; it holds references to `job` and `callbacks`, so
// finish_loop_warm_up must be called before they go.
std::future<void> warm_up_loop_kernels_beside(const RunContext& run, const pipeline::DenoiseJob& job,
                                              const pipeline::LoopCallbacks& callbacks) {
  if (!run.options.warm_up) return {};
  return std::async(std::launch::async, [&run, &job, &callbacks] {
    c10::OptionalDeviceGuard device_guard;
    if (run.device.is_cuda()) device_guard.reset_device(run.device);
    const auto started = std::chrono::steady_clock::now();
    pipeline::warm_up_loop_kernels(job, callbacks);
    DP_INFO("rank 0: warmed up the loop's kernels (timestep rows, Euler step, finite check) beside the blocks' load "
            "in ", human_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()));
  });
}

// A failed warm-up costs only speed: step 1 then loads those kernels itself.
void finish_loop_warm_up(std::future<void>& warming) {
  if (!warming.valid()) return;
  try {
    warming.get();
  } catch (const std::exception& e) {
    DP_WARN("rank 0: warming up the loop's kernels failed, step 1 pays their first use: ", e.what());
  }
}

}  // namespace

CoordinatorRing coordinator_ring_phase(RunContext& run, const CoordinatorStart& start, CoordinatorImages& images) {
  const auto& request = run.request;
  const auto& options = run.options;
  const auto& checkpoints = run.checkpoints();
  const at::Device& device = run.device;
  const at::Tensor& latents = start.latents;
  CoordinatorRing result;
  pipeline::StageTimer timer("denoise", device, run.flux.report_sink());
  const pipeline::DenoiseSchedule schedule = run.flux.schedule(request, latents.size(1));
  pipeline::DenoiseJob job =
      pipeline::make_denoise_job(request, start.prompts, latents, schedule, options.microbatch_size);
  pipeline::LoopCallbacks callbacks;
  // NaN weights or an overflow give an all-black image with exit 0 unless a step is checked: one reduction each.
  const int steps = schedule.scheduler.num_inference_steps();
  const bool several_microbatches = latents.size(0) > options.microbatch_size;
  callbacks.check_step = [steps, several_microbatches](int64_t microbatch, int step, const at::Tensor& stepped) {
    const std::string where = several_microbatches ? str("microbatch ", microbatch) : "";
    pipeline::check_step_latents(stepped, {step + 1, steps, where});
  };
  LoadedStage loaded = timer.loading("transformer load", [&] {
    auto warming = warm_up_loop_kernels_beside(run, job, callbacks);
    LoadedStage taken = take_loaded_stage(run);
    finish_loop_warm_up(warming);
    return taken;
  });
  run.connect_transport();  // unless the encode phase did
  result.figures.load_seconds = loaded.seconds;
  result.figures.load_bytes = loaded.bytes;
  images.prepare(loaded.bytes);
  RingExecutor executor(run.layout(), run.transport.get(), loaded.stage, device, options.transport_timeout_seconds,
                        run.exchange.get());
  if (run.decode && images.decoding_rank() != 0)
    executor.listen_to(images.decoding_rank(), [&images](Message& message) { images.take(message); });
  // Checkpoints hold every image's latents, finished ones too (a resume decodes those again).
  job.keep_final_latents = !run.decode || !checkpoints.dir.empty();
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
  Checkpointer checkpointer(checkpoints, checkpoints.dir.empty() ? io::Checkpoint{}
                                                                 : checkpoint_base(run, schedule, start.prompts));
  if (!checkpoints.dir.empty())
    callbacks.at_boundary = [&checkpointer](const pipeline::LoopState& state) { return checkpointer.at_boundary(state); };
  if (run.decode) {
    callbacks.on_microbatch_done = [&](int64_t first_row, const at::Tensor& done) {
      images.hand_over(first_row / options.microbatch_size, done);
    };
  }
  StepProfile profile(options.torch_profile_path, options.torch_profile_steps, device);
  if (run.outputs.on_step || profile.active()) {
    callbacks.on_step = [&](const pipeline::LoopProgress& p) {
      if (run.outputs.on_step) {
        // The step's latents come from the compute stream: waiting for that stream alone keeps the progress
        // line honest without waiting for transfers in flight on the transport's streams (a device-wide sync
        // would also wait for receives pre-posted for later steps).
#ifdef DIFFPIPE_HAVE_CUDA
        if (device.is_cuda()) at::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
        run.outputs.on_step(p);
      }
      profile.after_step(p.step);
    };
  }
  const auto began = std::chrono::steady_clock::now();
  profile.start();
  result.final_latents =
      pipeline::run_phase(0, "denoising", [&] { return pipeline::run_denoise_loop(job, executor, callbacks); });
  profile.finish();
  log_offload(run, loaded.stage.get());
  checkpointer.finish();  // the last checkpoint on disk (or its failure) before the ranks stop
  executor.shutdown();
  result.outcome.stopped = checkpointer.stopped();
  result.outcome.checkpoint = checkpointer.last_path();
  run.world.share_from_coordinator(result.outcome.stopped ? 1 : 0, options.transport_timeout_seconds);
  result.figures.times = executor.times();
  result.figures.times.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  result.figures.offload = loaded.stage ? loaded.stage->offload_stats() : models::OffloadStats{};
  if (run.transport)
    DP_INFO("rank 0: ", executor.times().steps, " microbatch steps computed, ", std::fixed, std::setprecision(2),
            executor.times().wait_seconds, " s waiting for results; ", run.transport->bytes_sent() / 1e6, " MB sent, ",
            run.transport->bytes_received() / 1e6, " MB received");
  return result;
}  // the coordinator's blocks are released before a VAE that did not fit next to them loads

RankTimes worker_ring_phase(RunContext& run, pipeline::FluxStage* stage, const std::function<void(Message&)>& on_decode) {
  const placement::RankStage* mine = run.layout().stage_of(run.world.rank());
  const std::string phase = str("denoising (blocks [", mine ? mine->first_block : 0, ", ", mine ? mine->last_block : 0, "))");
  return pipeline::run_phase(run.world.rank(), phase, [&] {
    return run_stage_worker(run.world.rank(), run.layout(), *run.transport, stage, run.device,
                            run.options.transport_timeout_seconds, on_decode, run.exchange.get());
  });
}

}  // namespace dp::runtime
