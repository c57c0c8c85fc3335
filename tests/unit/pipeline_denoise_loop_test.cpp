// The denoising loop's order with a fake executor: microbatches enter a window as deep as the executor, their
// prompts sent only as they enter, and each is handed over as soon as its last step is back, so a long batch
// finishes microbatch by microbatch and holds only the window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "pipeline/denoise_loop.h"
#include "pipeline/finite_check.h"

namespace dp::pipeline {
namespace {

// Answers every step with a prediction that depends on the microbatch's latents only, after `depth` submits are
// queued (a ring of `depth` stages), and records the order of events.
class FakeRing : public StageExecutor {
 public:
  explicit FakeRing(int depth) : depth_(depth) {}
  void send_prompts(int64_t microbatch, const at::Tensor&, const at::Tensor&) override {
    events.push_back("prompts " + std::to_string(microbatch));
    holding.insert(microbatch);
    max_holding = std::max(max_holding, holding.size());
  }
  void submit(int64_t microbatch, int step, std::vector<at::Tensor> inputs) override {
    events.push_back("submit " + std::to_string(microbatch) + " step " + std::to_string(step));
    const bool poisoned = microbatch == nan_microbatch && step == nan_step;
    queue_.push_back({microbatch, step, poisoned ? at::full_like(inputs[0], NAN) : inputs[0] * 0.5 + 0.25});
  }
  StepResult wait_result() override {
    EXPECT_FALSE(queue_.empty());
    StepResult result = queue_.front();
    queue_.pop_front();
    return result;
  }
  void release(int64_t microbatch) override {
    events.push_back("release " + std::to_string(microbatch));
    holding.erase(microbatch);
  }
  int max_in_flight() const override { return depth_; }

  std::vector<std::string> events;
  std::set<int64_t> holding;  // microbatches whose prompts the first stage keeps
  size_t max_holding = 0;
  int64_t nan_microbatch = -1;  // this microbatch's prediction at nan_step is all NaN
  int nan_step = -1;

 private:
  int depth_;
  std::deque<StepResult> queue_;
};

struct LoopRun {
  at::Tensor result;
  std::vector<int64_t> done_rows;
  std::vector<at::Tensor> done_latents;
  std::vector<int> progress;
};

LoopRun run_loop(FakeRing& ring, int64_t batch, int64_t microbatch_size, int steps, bool keep) {
  schedulers::FlowMatchEulerScheduler scheduler{schedulers::FlowMatchSchedulerConfig{}};
  scheduler.set_timesteps(steps);
  DenoiseJob job;
  job.latents = at::arange(batch * 6, at::kFloat).reshape({batch, 3, 2}) / 10;
  job.prompt_embeds = at::zeros({batch, 4, 8});
  job.pooled = at::zeros({batch, 8});
  job.microbatch_size = microbatch_size;
  job.scheduler = &scheduler;
  job.keep_final_latents = keep;
  LoopRun run;
  LoopCallbacks callbacks;
  callbacks.check_step = [&](int64_t microbatch, int step, const at::Tensor& latents) {
    const bool finite = all_finite(latents);
    ring.events.push_back("check " + std::to_string(microbatch) + " step " + std::to_string(step) +
                          (finite ? "" : " not finite"));
    if (!finite) throw std::runtime_error("step " + std::to_string(step) + " not finite");
  };
  callbacks.on_microbatch_done = [&](int64_t first_row, const at::Tensor& latents) {
    run.done_rows.push_back(first_row);
    run.done_latents.push_back(latents.clone());
    ring.events.push_back("done " + std::to_string(first_row));
  };
  callbacks.on_step = [&](const LoopProgress& p) {
    run.progress.push_back(p.step);
    ring.events.push_back("progress " + std::to_string(p.step));
  };
  run.result = run_denoise_loop(job, ring, callbacks);
  return run;
}

TEST(DenoiseLoop, MicrobatchesFinishOneAfterAnotherInAWindowAsDeepAsTheRing) {
  FakeRing ring(2);
  const LoopRun run = run_loop(ring, 6, 1, 4, true);
  EXPECT_EQ(run.done_rows, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // Only the window's prompts are held; microbatch 2 enters only after microbatch 0 is released.
  EXPECT_EQ(ring.max_holding, 2u);
  const auto at = [&](const std::string& event) {
    return std::find(ring.events.begin(), ring.events.end(), event) - ring.events.begin();
  };
  EXPECT_LT(at("done 0"), at("prompts 2"));
  EXPECT_LT(at("release 0"), at("prompts 2"));
  EXPECT_LT(at("done 0"), at("done 5"));
  // Progress counts whole-batch steps of work done, once each, up to the last.
  EXPECT_EQ(run.progress, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(run.result.size(0), 6);
}

// Each step is checked before the next one is queued, reported, or its microbatch handed on; a step whose latents
// hold NaN stops the loop there, named, with nothing after it queued, reported or handed on.
TEST(DenoiseLoop, EachStepIsCheckedBeforeAnythingFollowsAndANonFiniteOneStopsTheLoop) {
  FakeRing ring(1);
  run_loop(ring, 2, 2, 3, true);
  const std::vector<std::string> order{"prompts 0", "submit 0 step 0", "check 0 step 0", "progress 1",
                                       "submit 0 step 1", "check 0 step 1", "progress 2", "submit 0 step 2",
                                       "check 0 step 2", "release 0", "done 0", "progress 3"};
  EXPECT_EQ(ring.events, order);
  FakeRing poisoned(1);
  poisoned.nan_microbatch = 0;
  poisoned.nan_step = 1;
  try {
    run_loop(poisoned, 2, 2, 4, true);
    ADD_FAILURE() << "a step with NaN latents went through";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "step 1 not finite");
  }
  const std::vector<std::string> stopped{"prompts 0", "submit 0 step 0", "check 0 step 0", "progress 1",
                                         "submit 0 step 1", "check 0 step 1 not finite"};
  EXPECT_EQ(poisoned.events, stopped);
}

TEST(DenoiseLoop, WithoutKeepingTheLatentsEachMicrobatchIsHandedOverAndNothingReturned) {
  FakeRing kept_ring(3), dropped_ring(3);
  const LoopRun kept = run_loop(kept_ring, 5, 2, 3, true);
  const LoopRun dropped = run_loop(dropped_ring, 5, 2, 3, false);
  EXPECT_FALSE(dropped.result.defined());
  ASSERT_EQ(dropped.done_rows, (std::vector<int64_t>{0, 2, 4}));
  for (size_t i = 0; i < dropped.done_rows.size(); ++i) {
    EXPECT_TRUE(at::equal(dropped.done_latents[i], kept.done_latents[i]));
    EXPECT_TRUE(at::equal(dropped.done_latents[i], kept.result.narrow(0, dropped.done_rows[i], dropped.done_latents[i].size(0))));
  }
}

// A ring of `depth` stages whose prediction depends on the prompts of the executor microbatch (their mean), so
// that a pass run with the wrong prompts shows; it answers only once `depth` passes are queued or nothing more
// can come, as a ring whose stages all work at once.
class PromptRing : public StageExecutor {
 public:
  explicit PromptRing(int depth) : depth_(depth) {}
  void send_prompts(int64_t microbatch, const at::Tensor& embeds, const at::Tensor&) override {
    offsets_[microbatch] = embeds.mean().item<double>();
  }
  bool takes_schedule() const override { return true; }
  void send_schedule(int64_t microbatch, const StepSchedule& schedule) override { schedules[microbatch] = schedule; }
  void submit(int64_t microbatch, int step, std::vector<at::Tensor> inputs) override {
    queue_.push_back({microbatch, step, inputs[0] * 0.5 + offsets_.at(microbatch)});
    max_queued = std::max(max_queued, queue_.size());
    inputs_seen.push_back(inputs);
    submitted.push_back(microbatch);
    steps_seen.push_back(step);
  }
  StepResult wait_result() override {
    StepResult result = queue_.front();
    queue_.pop_front();
    return result;
  }
  void release(int64_t microbatch) override { released.push_back(microbatch); }
  int max_in_flight() const override { return depth_; }

  size_t max_queued = 0;
  std::vector<int64_t> submitted, released;
  std::vector<std::vector<at::Tensor>> inputs_seen;
  std::vector<int> steps_seen;
  std::map<int64_t, StepSchedule> schedules;

 private:
  int depth_;
  std::map<int64_t, double> offsets_;
  std::deque<StepResult> queue_;
};

DenoiseJob cfg_job(const schedulers::FlowMatchEulerScheduler& scheduler, int64_t batch) {
  DenoiseJob job;
  job.latents = at::arange(batch * 6, at::kFloat).reshape({batch, 3, 2}) / 10;
  job.prompt_embeds = at::full({batch, 4, 8}, 0.25);
  job.pooled = at::zeros({batch, 8});
  job.negative_prompt_embeds = at::full({batch, 4, 8}, -0.5);
  job.negative_pooled = at::zeros({batch, 8});
  job.true_cfg_scale = 3.0;
  job.microbatch_size = 1;
  job.scheduler = &scheduler;
  return job;
}

TEST(DenoiseLoop, TrueCfgRunsBothPassesAtOnceAndStepsOnTheirCombination) {
  schedulers::FlowMatchEulerScheduler scheduler{schedulers::FlowMatchSchedulerConfig{}};
  scheduler.set_timesteps(3);
  const DenoiseJob job = cfg_job(scheduler, 1);
  PromptRing ring(2);
  const at::Tensor result = run_denoise_loop(job, ring, {});
  // One image in a two-stage ring: its prompts pass (0) and negative pass (1) are in flight together.
  EXPECT_EQ(ring.max_queued, 2u);
  EXPECT_EQ(ring.submitted, (std::vector<int64_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(ring.released, (std::vector<int64_t>{0, 1}));
  // FluxPipeline's step: uncond + scale * (cond - uncond), then Euler.
  at::Tensor latents = job.latents.clone();
  for (int step = 0; step < 3; ++step) {
    const at::Tensor cond = latents * 0.5 + 0.25, uncond = latents * 0.5 - 0.5;
    latents = scheduler.step(uncond + 3.0 * (cond - uncond), step, latents);
  }
  EXPECT_TRUE(at::allclose(result, latents, 1e-6, 1e-6)) << result << latents;
}

TEST(DenoiseLoop, TrueCfgWindowHoldsHalfAsManyMicrobatchesAndAdapterChoicesTravelWithEveryPass) {
  schedulers::FlowMatchEulerScheduler scheduler{schedulers::FlowMatchSchedulerConfig{}};
  scheduler.set_timesteps(2);
  DenoiseJob job = cfg_job(scheduler, 3);
  job.adapter_choices = at::tensor(std::vector<int64_t>{2, 0, 1});
  PromptRing ring(2);
  run_denoise_loop(job, ring, {});
  // Two passes deep: one microbatch (both of its passes) in the window at a time, the next entering as it leaves.
  EXPECT_EQ(ring.max_queued, 2u);
  EXPECT_EQ(ring.submitted, (std::vector<int64_t>{0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5}));
  for (size_t i = 0; i < ring.submitted.size(); ++i) {
    ASSERT_EQ(ring.inputs_seen[i].size(), 4u);
    const int64_t image = ring.submitted[i] / 2;
    EXPECT_EQ(ring.inputs_seen[i][3].item<int64_t>(), job.adapter_choices[image].item<int64_t>());
  }
}

// A first stage computes its modulation rows for a whole schedule from what send_schedule hands it, and takes a
// step's rows from them by the step's index: each pass's schedule must hold, at every step, the very timestep and
// guidance that step then brings (FluxStage::set_schedule).
TEST(DenoiseLoop, EachPassIsSentTheTimestepsAndGuidanceItsStepsBring) {
  schedulers::FlowMatchEulerScheduler scheduler{schedulers::FlowMatchSchedulerConfig{}};
  scheduler.set_timesteps(4);
  DenoiseJob job = cfg_job(scheduler, 3);
  job.guidance = 4.5;
  PromptRing ring(2);
  run_denoise_loop(job, ring, {});
  EXPECT_EQ(ring.schedules.size(), 6u) << "one schedule per pass of each image";
  for (size_t i = 0; i < ring.submitted.size(); ++i) {
    const StepSchedule& schedule = ring.schedules.at(ring.submitted[i]);
    ASSERT_EQ(schedule.timesteps.size(), 4u);
    const auto& inputs = ring.inputs_seen[i];
    EXPECT_TRUE(at::equal(schedule.timesteps[static_cast<size_t>(ring.steps_seen[i])], inputs[1]))
        << "pass " << ring.submitted[i] << ", step " << ring.steps_seen[i];
    ASSERT_TRUE(schedule.guidance.defined());
    EXPECT_TRUE(at::equal(schedule.guidance, inputs[2]));
  }
}

// The loop's kernels warmed on zeros: one microbatch's shape goes through the check, nothing of the job changes
// (the scheduler's timesteps, the latents) and the run after it gives what it gives without.
TEST(DenoiseLoop, WarmingUpTheLoopsKernelsChecksOneMicrobatchOfZerosAndLeavesTheJobAlone) {
  for (const bool cfg : {false, true}) {
    schedulers::FlowMatchEulerScheduler scheduler{schedulers::FlowMatchSchedulerConfig{}};
    scheduler.set_timesteps(3);
    DenoiseJob job = cfg_job(scheduler, 3);
    if (!cfg) job.true_cfg_scale = 1.0;
    job.microbatch_size = 2;
    const at::Tensor latents_before = job.latents.clone();
    const std::vector<float> timesteps_before = scheduler.timesteps();
    std::vector<at::Tensor> checked;
    LoopCallbacks callbacks;
    callbacks.check_step = [&](int64_t, int, const at::Tensor& stepped) { checked.push_back(stepped.clone()); };
    warm_up_loop_kernels(job, callbacks);
    ASSERT_EQ(checked.size(), 1u);
    EXPECT_EQ(checked[0].sizes(), (std::vector<int64_t>{2, job.latents.size(1), job.latents.size(2)}));
    EXPECT_EQ(checked[0].scalar_type(), job.latents.scalar_type());
    EXPECT_EQ(checked[0].count_nonzero().item<int64_t>(), 0);
    EXPECT_TRUE(at::equal(job.latents, latents_before));
    EXPECT_EQ(scheduler.timesteps(), timesteps_before);
    // A microbatch larger than the batch warms the batch's rows.
    job.microbatch_size = 8;
    checked.clear();
    warm_up_loop_kernels(job, callbacks);
    ASSERT_EQ(checked.size(), 1u);
    EXPECT_EQ(checked[0].size(0), 3);
  }
}

}  // namespace
}  // namespace dp::pipeline
