#include "pipeline/denoise_loop.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace dp::pipeline {

void LocalExecutor::send_prompts(int64_t microbatch, const at::Tensor& prompt_embeds, const at::Tensor& pooled) {
  stage_->set_prompts(microbatch, prompt_embeds, pooled);
}

void LocalExecutor::send_schedule(int64_t microbatch, const StepSchedule& schedule) {
  stage_->set_schedule(microbatch, schedule);
}

void LocalExecutor::submit(int64_t microbatch, int step, std::vector<at::Tensor> inputs) {
  auto outputs = stage_->run(microbatch, inputs, step);
  DP_CHECK(outputs.size() == 1, "the local stage must hold the whole transformer");
  done_.push_back({microbatch, step, std::move(outputs[0])});
}

StepResult LocalExecutor::wait_result() {
  DP_CHECK(!done_.empty(), "waiting for a step that was never submitted");
  StepResult result = std::move(done_.front());
  done_.pop_front();
  return result;
}

namespace {

// One step's transformer inputs for the rows [first_row, first_row + latents.size(0)) at `step`.
std::vector<at::Tensor> transformer_inputs(const DenoiseJob& job, const at::Tensor& latents, int64_t first_row,
                                           int step) {
  const int64_t rows = latents.size(0);
  const float t = job.scheduler->timesteps()[static_cast<size_t>(step)];
  // FluxPipeline passes t cast to the latent dtype, divided by 1000 in that dtype.
  at::Tensor timestep = at::full({rows}, t, latents.options()) / 1000;
  at::Tensor guidance;
  // Both passes of true CFG take the same guidance embedding, as FluxPipeline's two transformer calls do.
  if (job.guidance_embeds) guidance = at::full({rows}, job.guidance, latents.options().dtype(at::kFloat));
  std::vector<at::Tensor> inputs{latents, timestep, guidance};
  if (job.adapter_choices.defined()) inputs.push_back(job.adapter_choices.narrow(0, first_row, rows));
  return inputs;
}

// FluxPipeline: neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred), in the run dtype.
at::Tensor true_cfg_noise(const at::Tensor& cond, const at::Tensor& uncond, double scale) {
  return uncond + scale * (cond - uncond);
}

struct Microbatch {
  int64_t first_row = 0;
  at::Tensor latents;
  int next_step = 0;
  int64_t rows = 0;  // kept apart from latents, which a finished microbatch may drop
  // True CFG: the noise predictions of this step's passes that are back (cond, uncond).
  at::Tensor pass_results[2];
};

}  // namespace

at::Tensor run_denoise_loop(const DenoiseJob& job, StageExecutor& executor, const LoopCallbacks& callbacks) {
  c10::InferenceMode guard;
  DP_CHECK(job.scheduler != nullptr && job.scheduler->num_inference_steps() > 0, "the scheduler has no timesteps");
  DP_CHECK(job.microbatch_size >= 1, "--microbatch-size must be at least 1, got ", job.microbatch_size);
  const int64_t batch = job.latents.size(0);
  const int steps = job.scheduler->num_inference_steps();

  DP_CHECK(job.start_steps.empty() || static_cast<int64_t>(job.start_steps.size()) == batch, "resume: ",
           job.start_steps.size(), " image step indices for a batch of ", batch);
  const auto start_step = [&](int64_t row) { return job.start_steps.empty() ? 0 : job.start_steps[static_cast<size_t>(row)]; };
  std::vector<Microbatch> microbatches;
  for (int64_t row = 0; row < batch; row += job.microbatch_size) {
    const int64_t rows = std::min(job.microbatch_size, batch - row);
    const int first = start_step(row);
    DP_CHECK(first >= 0 && first <= steps, "resume: image ", row, " is at step ", first, " of ", steps);
    for (int64_t r = row; r < row + rows; ++r)
      DP_CHECK(start_step(r) == first, "resume: images ", row, " and ", r, " of one microbatch (--microbatch-size ",
               job.microbatch_size, ") are at steps ", first, " and ", start_step(r),
               "; resume with the microbatch size the checkpoint was written with");
    microbatches.push_back({row, job.latents.narrow(0, row, rows), first, rows, {}});
  }
  const bool cfg = job.true_cfg_scale > 1;
  DP_CHECK(!cfg || (job.negative_prompt_embeds.defined() && job.negative_pooled.defined() &&
                    job.negative_prompt_embeds.size(0) == batch && job.negative_pooled.size(0) == batch),
           "true CFG needs negative prompt embeddings for each of the ", batch, " images");
  DP_CHECK(!job.adapter_choices.defined() || job.adapter_choices.size(0) == batch, "adapter choices for ",
           job.adapter_choices.defined() ? job.adapter_choices.size(0) : 0, " images, the batch has ", batch);
  // Executor microbatch ids: with true CFG, pass 0 (the prompts) of microbatch i is 2i and pass 1 (the negative
  // prompts) 2i + 1.
  const int passes = cfg ? 2 : 1;
  const auto step_inputs = [&](const Microbatch& m) {
    return transformer_inputs(job, m.latents, m.first_row, m.next_step);
  };

  // A window of `depth` microbatches circulates: each has one step in flight at a time, and a microbatch's next
  // step enters as soon as its previous one is back, so with at least as many microbatches as stages every
  // stage has work. A microbatch's prompts reach the first stage only when it enters the window, so the stage
  // keeps the embedded prompts of the window, not of the whole batch.
  const int depth = std::max(1, executor.max_in_flight());
  const bool takes_schedule = executor.takes_schedule();
  const auto count = static_cast<int64_t>(microbatches.size());
  const auto started = std::chrono::steady_clock::now();
  std::vector<int> finished_steps;
  for (const auto& m : microbatches) finished_steps.push_back(m.next_step);
  int reported_step = *std::min_element(finished_steps.begin(), finished_steps.end());
  int64_t row_steps_done = 0;  // sum over microbatches of rows x steps finished
  for (const auto& m : microbatches) row_steps_done += m.latents.size(0) * m.next_step;
  int64_t images_done = 0;
  const auto finish = [&](Microbatch& m) {
    images_done += m.latents.size(0);
    if (callbacks.on_microbatch_done) callbacks.on_microbatch_done(m.first_row, m.latents);
    if (!job.keep_final_latents) m.latents = at::Tensor();
  };
  std::deque<int64_t> ready;  // executor microbatch ids (passes) whose next step can be submitted
  int64_t next_to_enter = 0;
  int active = 0;
  const auto admit = [&] {
    while ((active * passes < depth || active == 0) && next_to_enter < count) {
      const int64_t i = next_to_enter++;
      auto& m = microbatches[static_cast<size_t>(i)];
      if (m.next_step >= steps) {
        // Finished before a resume: its latents come from the checkpoint, and it is handed on (decoded) again.
        finish(m);
        continue;
      }
      const int64_t rows = m.latents.size(0);
      // Every step's timestep and guidance, as step_inputs will make them; both passes of true CFG take the same.
      StepSchedule schedule;
      for (int s = 0; s < steps && takes_schedule; ++s) {
        const auto inputs = transformer_inputs(job, m.latents, m.first_row, s);
        schedule.timesteps.push_back(inputs[1]);
        schedule.guidance = inputs[2];
      }
      executor.send_prompts(i * passes, job.prompt_embeds.narrow(0, m.first_row, rows),
                            job.pooled.narrow(0, m.first_row, rows));
      if (takes_schedule) executor.send_schedule(i * passes, schedule);
      ready.push_back(i * passes);
      if (cfg) {
        executor.send_prompts(i * passes + 1, job.negative_prompt_embeds.narrow(0, m.first_row, rows),
                              job.negative_pooled.narrow(0, m.first_row, rows));
        if (takes_schedule) executor.send_schedule(i * passes + 1, schedule);
        ready.push_back(i * passes + 1);
      }
      ++active;
    }
  };
  admit();
  const auto state = [&]() {
    LoopState now;
    for (const auto& m : microbatches) now.image_steps.insert(now.image_steps.end(), static_cast<size_t>(m.rows), m.next_step);
    now.steps_done = *std::min_element(finished_steps.begin(), finished_steps.end());
    now.steps = steps;
    now.latents = [&microbatches, &job] {
      std::vector<at::Tensor> parts;
      for (const auto& m : microbatches)
        // A finished microbatch whose latents were dropped (images written, keep_final_latents off) is stored as
        // zeros: a resume does not run or decode it again only if it keeps them, which is why checkpointing runs
        // keep them.
        parts.push_back(m.latents.defined() ? m.latents
                                            : at::zeros({m.rows, job.latents.size(1), job.latents.size(2)},
                                                        job.latents.options()));
      return at::cat(parts, 0);
    };
    return now;
  };
  int in_flight = 0;
  bool stopping = false;
  while (!ready.empty() || in_flight > 0) {
    if (stopping) {
      // The state returned is the one the caller saw at the stop; steps still in flight come back and are
      // dropped, so that the executor (the ring) is quiet when it shuts down.
      if (in_flight == 0) break;
      executor.wait_result();
      --in_flight;
      continue;
    }
    while (!ready.empty() && in_flight < depth) {
      const int64_t id = ready.front();
      ready.pop_front();
      auto& m = microbatches[static_cast<size_t>(id / passes)];
      executor.submit(id, m.next_step, step_inputs(m));
      ++in_flight;
    }
    StepResult result = executor.wait_result();
    --in_flight;
    const int64_t index = result.microbatch / passes;
    const int pass = static_cast<int>(result.microbatch % passes);
    DP_CHECK(result.microbatch >= 0 && index < next_to_enter,
             "a result came back for microbatch ", result.microbatch, ", which is not in flight");
    auto& m = microbatches[static_cast<size_t>(index)];
    DP_CHECK(m.latents.defined() && result.step == m.next_step && !m.pass_results[pass].defined(), "microbatch ",
             result.microbatch, ": result of step ", result.step, " while step ", m.next_step, " was in flight");
    at::Tensor noise_pred = result.noise_pred.to(m.latents.device());
    if (cfg) {
      m.pass_results[pass] = noise_pred;
      if (!m.pass_results[1 - pass].defined()) continue;  // the Euler step waits for the other pass
      const at::Tensor cond = std::move(m.pass_results[0]), uncond = std::move(m.pass_results[1]);
      m.pass_results[0] = m.pass_results[1] = at::Tensor();
      noise_pred = true_cfg_noise(cond, uncond, job.true_cfg_scale);
    }
    m.latents = job.scheduler->step(noise_pred, m.next_step, m.latents);
    if (callbacks.check_step) callbacks.check_step(index, m.next_step, m.latents);
    ++m.next_step;
    finished_steps[static_cast<size_t>(index)] = m.next_step;
    row_steps_done += m.latents.size(0);
    if (m.next_step < steps) {
      for (int p = 0; p < passes; ++p) ready.push_back(index * passes + p);
    } else {
      for (int p = 0; p < passes; ++p) executor.release(index * passes + p);
      --active;
      finish(m);
      admit();
    }
    const int whole_steps = static_cast<int>(row_steps_done / batch);
    for (; reported_step < whole_steps; ++reported_step) {
      if (callbacks.on_step)
        callbacks.on_step({reported_step + 1, steps, images_done,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()});
    }
    if (callbacks.at_boundary && callbacks.at_boundary(state())) stopping = true;
  }
  if (!job.keep_final_latents && !stopping) return at::Tensor();
  return state().latents();
}

void warm_up_loop_kernels(const DenoiseJob& job, const LoopCallbacks& callbacks) {
  c10::InferenceMode guard;
  DP_CHECK(job.scheduler != nullptr && job.scheduler->num_inference_steps() > 0, "the scheduler has no timesteps");
  const int64_t rows = std::min(job.microbatch_size, job.latents.size(0));
  const at::Tensor latents = at::zeros({rows, job.latents.size(1), job.latents.size(2)}, job.latents.options());
  (void)transformer_inputs(job, latents, 0, 0);  // for the kernels that make the rows, not for the rows
  at::Tensor noise_pred = at::zeros_like(latents);
  if (job.true_cfg_scale > 1) noise_pred = true_cfg_noise(noise_pred, at::zeros_like(latents), job.true_cfg_scale);
  const at::Tensor stepped = job.scheduler->step(noise_pred, 0, latents);
  // A kernel loads when it is launched, so nothing needs to wait for these to finish.
  if (callbacks.check_step) callbacks.check_step(0, 0, stepped);
}

}  // namespace dp::pipeline
