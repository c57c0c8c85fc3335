#pragma once
// The denoising loop of FluxPipeline, as one code path for one process and for N ranks. The batch is cut
// into microbatches; each microbatch goes through the transformer step after step, and the loop applies the
// scheduler's Euler update when its noise prediction comes back. Where the transformer runs is the
// executor's business: in this process (LocalExecutor) or over a ring of ranks (runtime/), with several
// microbatches in flight so that every stage is busy.
#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "pipeline/flux_stage.h"
#include "schedulers/flow_match_scheduler.h"

namespace dp::pipeline {

struct StepResult {
  int64_t microbatch = 0;
  int step = 0;
  at::Tensor noise_pred;  // (b, N_img, C) in the run dtype
};

// Runs transformer steps for the loop. submit() hands over one step of one microbatch; results come back
// in any order through wait_result().
class StageExecutor {
 public:
  virtual ~StageExecutor() = default;
  // Before a microbatch's first step: its prompt embeddings, for whoever runs the first stage.
  virtual void send_prompts(int64_t microbatch, const at::Tensor& prompt_embeds, const at::Tensor& pooled) = 0;
  // Whether the first stage computes its blocks' modulation rows for all steps at once (FluxStage::takes_schedule);
  // only then does the loop make each microbatch's schedule and send it, after send_prompts. The steps' results
  // are the same bits either way.
  virtual bool takes_schedule() const { return false; }
  virtual void send_schedule(int64_t /*microbatch*/, const StepSchedule& /*schedule*/) {}
  // inputs: packed latents (b, N_img, C), timestep (b,) in [0, 1], guidance (b,) or undefined.
  virtual void submit(int64_t microbatch, int step, std::vector<at::Tensor> inputs) = 0;
  // Blocks until one submitted step is done; throws if it cannot be (a failed rank, a timeout).
  virtual StepResult wait_result() = 0;
  // After a microbatch's last step: stages drop what they kept for it.
  virtual void release(int64_t microbatch) = 0;
  // How many steps may be in flight at once (the ring's depth); at least 1.
  virtual int max_in_flight() const = 0;
};

// The whole transformer in this process.
class LocalExecutor : public StageExecutor {
 public:
  explicit LocalExecutor(std::shared_ptr<FluxStage> stage) : stage_(std::move(stage)) {}
  void send_prompts(int64_t microbatch, const at::Tensor& prompt_embeds, const at::Tensor& pooled) override;
  bool takes_schedule() const override { return stage_->takes_schedule(); }
  void send_schedule(int64_t microbatch, const StepSchedule& schedule) override;
  void submit(int64_t microbatch, int step, std::vector<at::Tensor> inputs) override;
  StepResult wait_result() override;
  void release(int64_t microbatch) override { stage_->forget(microbatch); }
  int max_in_flight() const override { return 1; }

 private:
  std::shared_ptr<FluxStage> stage_;
  std::deque<StepResult> done_;
};

struct DenoiseJob {
  at::Tensor latents;        // (B, N_img, C) packed initial noise, in the run dtype, for the whole batch
  at::Tensor prompt_embeds;  // (B, N_txt, joint_attention_dim), one row per image
  at::Tensor pooled;         // (B, pooled_projection_dim)
  double guidance = 3.5;
  bool guidance_embeds = true;  // the transformer's config: whether guidance is an input
  int64_t microbatch_size = 1;  // images per microbatch; the last one may be smaller
  // Whether run_denoise_loop returns the whole batch's final latents. Off when each finished microbatch goes to
  // on_microbatch_done and nothing else needs it (PNG output): its latents are dropped there, so a batch of
  // hundreds of images holds only the microbatches in flight.
  bool keep_final_latents = true;
  const schedulers::FlowMatchEulerScheduler* scheduler = nullptr;  // timesteps set
  // True classifier-free guidance (FluxPipeline's true_cfg_scale > 1 with a negative prompt): every step of a
  // microbatch also runs its negative prompt's embeddings (one row per image, like prompt_embeds), as a pass of
  // its own through the executor, and the Euler step waits for both: noise = uncond + scale * (cond - uncond).
  // Off when true_cfg_scale <= 1.
  at::Tensor negative_prompt_embeds;
  at::Tensor negative_pooled;
  double true_cfg_scale = 1.0;
  // (B,) int64 adapter choice per image (unfused LoRA with prompts that choose); appended to every pass's
  // inputs. Undefined: every image uses the default adapters.
  at::Tensor adapter_choices;
  // Where each image starts (a resumed checkpoint): steps already done per image, empty for all 0. The images
  // of one microbatch must be at the same step; a microbatch already at the last step is not run again.
  std::vector<int32_t> start_steps;
};

struct LoopProgress {
  // Steps of the whole batch done: microbatch steps finished, in units of one step of every image (rounded
  // down). Microbatches run a few at a time, so this counts work done, not the slowest microbatch's step.
  int step = 0;
  int steps = 0;
  int64_t images_done = 0;
  double elapsed_seconds = 0;
};

struct LoopCallbacks {
  // Each time every microbatch has finished one more step.
  std::function<void(const LoopProgress&)> on_step;
  // When a microbatch has finished its last step: rows [first_row, first_row + latents.size(0)) of the batch.
  std::function<void(int64_t first_row, const at::Tensor& latents)> on_microbatch_done;
  // After every Euler update (non-finite values, say); throws to stop the run.
  std::function<void(int64_t microbatch, int step, const at::Tensor& latents)> check_step;
  // At each step boundary (after every Euler update and the on_step calls it causes): the loop's state, from
  // which a resumed loop continues exactly. Returning true stops the loop there: the steps still in flight
  // are drained and dropped, and run_denoise_loop returns the latents of that state.
  std::function<bool(const struct LoopState&)> at_boundary;
};

struct LoopState {
  std::vector<int32_t> image_steps;  // steps done per image (B)
  int steps_done = 0;                // the slowest image's
  int steps = 0;
  // The whole batch's latents (B, N_img, C) at image_steps; built when called (a concatenation).
  std::function<at::Tensor()> latents;
};

// Runs the loop to the end (or until at_boundary stops it: then the latents of that state) and returns the final latents of the whole batch (B, N_img, C), or an undefined
// tensor when job.keep_final_latents is off. Microbatches enter a window of executor.max_in_flight() at a time,
// in order: enough to keep every stage busy, and each leaves (and is handed to on_microbatch_done) as soon as
// its last step is back, so microbatches finish one after another rather than all in the last round.
// With true CFG each microbatch i is two executor microbatches, 2i (its prompts) and 2i + 1 (its negative
// prompts), submitted as separate passes: a window of max_in_flight() passes holds half as many microbatches,
// so a two-stage ring has both stages busy with a single image.
at::Tensor run_denoise_loop(const DenoiseJob& job, StageExecutor& executor, const LoopCallbacks& callbacks);

// The loop's own kernels outside the transformer, run once on zeros of one microbatch's shape through the loop's
// code: the timestep and guidance rows, true CFG's combination, the scheduler's Euler step and callbacks.check_step.
// CUDA loads each kernel on its first launch (lazy module loading, its default); left to the loop they made step 1
// 1.08-1.13x a later step (bench/RESULTS.md, 2026-12-06, session 11). Mostly the driver's host time (58-108 ms
// beside an H100's block load), on any thread, so that the caller can run it beside that load. Touches neither the
// job nor the scheduler.
void warm_up_loop_kernels(const DenoiseJob& job, const LoopCallbacks& callbacks);

}  // namespace dp::pipeline
