// The denoising loop's checkpoint hooks (pipeline/denoise_loop.h): a loop stopped at a step boundary by
// at_boundary, then run again from the state it returned (start_steps and latents), ends with latents
// bit-identical to an uninterrupted loop, also when the stop leaves microbatches at different steps (a ring of
// depth > 1), and at every boundary of the run.
#include <gtest/gtest.h>

#include <deque>

#include "core/error.h"
#include "pipeline/denoise_loop.h"
#include "schedulers/flow_match_scheduler.h"

namespace dp::pipeline {
namespace {

// A transformer stand-in: a deterministic function of the step's inputs, with up to `depth` steps in flight
// and results returned in submission order, as the ring returns them.
class FakeRing : public StageExecutor {
 public:
  explicit FakeRing(int depth) : depth_(depth) {}
  void send_prompts(int64_t, const at::Tensor&, const at::Tensor&) override {}
  void submit(int64_t microbatch, int step, std::vector<at::Tensor> inputs) override {
    const at::Tensor& latents = inputs[0];
    const at::Tensor& timestep = inputs[1];
    at::Tensor prediction = at::sin(latents * 3 + timestep.view({-1, 1, 1})) - latents * 0.25;
    queue_.push_back({microbatch, step, prediction});
    ++submitted;
  }
  StepResult wait_result() override {
    DP_CHECK(!queue_.empty(), "nothing in flight");
    StepResult r = queue_.front();
    queue_.pop_front();
    return r;
  }
  void release(int64_t) override {}
  int max_in_flight() const override { return depth_; }
  int submitted = 0;

 private:
  int depth_;
  std::deque<StepResult> queue_;
};

struct Fixture {
  schedulers::FlowMatchEulerScheduler scheduler{schedulers::FlowMatchSchedulerConfig{}};
  DenoiseJob job;
  Fixture(int steps, int64_t images) {
    scheduler.set_timesteps_from_sigmas(schedulers::flux_default_sigmas(steps));
    at::manual_seed(3);
    job.latents = at::randn({images, 6, 8});
    job.prompt_embeds = at::zeros({images, 2, 4});
    job.pooled = at::zeros({images, 4});
    job.guidance_embeds = false;
    job.microbatch_size = 1;
    job.scheduler = &scheduler;
  }
};

TEST(DenoiseLoopResume, StoppedAtAnyBoundaryAndResumedIsBitIdentical) {
  constexpr int kSteps = 5;
  constexpr int64_t kImages = 4;
  for (int depth : {1, 3}) {
    Fixture f(kSteps, kImages);
    FakeRing whole_ring(depth);
    const at::Tensor expected = run_denoise_loop(f.job, whole_ring, {});
    const int boundaries = whole_ring.submitted;  // one boundary per microbatch step
    bool saw_mixed_steps = false;
    for (int stop_at = 1; stop_at <= boundaries; ++stop_at) {
      FakeRing first_ring(depth);
      LoopState saved;
      at::Tensor saved_latents;
      int boundary = 0;
      LoopCallbacks callbacks;
      callbacks.at_boundary = [&](const LoopState& state) {
        if (++boundary != stop_at) return false;
        saved = state;
        saved_latents = state.latents();
        return true;
      };
      const at::Tensor returned = run_denoise_loop(f.job, first_ring, callbacks);
      ASSERT_TRUE(at::equal(returned, saved_latents)) << "the loop returns the state it stopped at";
      const auto [low, high] = std::minmax_element(saved.image_steps.begin(), saved.image_steps.end());
      saw_mixed_steps |= *low != *high;
      EXPECT_EQ(saved.steps_done, *low);

      DenoiseJob resumed = f.job;
      resumed.latents = saved_latents.clone();
      resumed.start_steps = saved.image_steps;
      FakeRing second_ring(depth);
      const at::Tensor got = run_denoise_loop(resumed, second_ring, {});
      ASSERT_TRUE(at::equal(got, expected)) << "depth " << depth << ", stopped at boundary " << stop_at
                                            << ": max difference " << (got - expected).abs().max().item<float>();
      // The resumed loop runs only the steps that were left.
      int left = 0;
      for (int32_t s : saved.image_steps) left += kSteps - s;
      EXPECT_EQ(second_ring.submitted, left);
    }
    if (depth > 1) {
      EXPECT_TRUE(saw_mixed_steps) << "a ring of depth 3 never stopped with images at different steps";
    }
  }
}

TEST(DenoiseLoopResume, RefusesAMicrobatchWhoseImagesAreAtDifferentSteps) {
  Fixture f(3, 4);
  f.job.microbatch_size = 2;
  f.job.start_steps = {1, 2, 0, 0};
  FakeRing ring(1);
  try {
    run_denoise_loop(f.job, ring, {});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("are at steps 1 and 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dp::pipeline
