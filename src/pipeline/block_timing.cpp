#include "pipeline/block_timing.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "models/flux/flux_transformer.h"
#include "pipeline/device_stats.h"

namespace dp::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

models::FluxActivations fresh(const models::FluxActivations& s) { return {s.image.clone(), s.text.clone(), s.temb.clone()}; }

}  // namespace

BlockTimes time_flux_blocks(const BlockTimingRequest& r) {
  c10::InferenceMode guard;
  const auto started = Clock::now();
  DP_CHECK(r.weights != nullptr, "block timing needs the transformer's weights");
  DP_CHECK(r.warmup >= 0 && r.repeat >= 1, "block timing needs at least one timed run and no negative warm-up");
  DP_CHECK(r.microbatch >= 1 && r.text_tokens >= 1, "block timing needs a microbatch and text tokens");
  const auto& config = r.config;
  DP_CHECK(config.num_layers >= 1 && config.num_single_layers >= 1, "block timing times one block of each kind; the ",
           "model has ", config.num_layers, " double and ", config.num_single_layers, " single blocks");
  const int64_t first_single = config.num_layers;
  const auto front = models::FluxTransformer::load(r.weights, config, r.dtype, r.device, {true, 0, 1, false});
  const auto back =
      models::FluxTransformer::load(r.weights, config, r.dtype, r.device, {false, first_single, first_single + 1, true});
  const int64_t m = r.microbatch;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t{0});
  models::FluxInputs in;
  in.hidden_states = at::randn({m, r.grid.tokens(), config.in_channels}, gen).to(r.device, r.dtype);
  in.encoder_hidden_states = at::randn({m, r.text_tokens, config.joint_attention_dim}, gen).to(r.device, r.dtype);
  in.pooled_projections = at::randn({m, config.pooled_projection_dim}, gen).to(r.device, r.dtype);
  in.timestep = at::full({m}, 0.75).to(r.device);
  in.img_ids = latent_image_ids(r.grid);
  in.txt_ids = at::zeros({r.text_tokens, 3});
  if (config.guidance_embeds) in.guidance = at::full({m}, 3.5).to(r.device);
  const auto rope = front.rotary(in.txt_ids, in.img_ids);
  const models::FluxActivations embedded = front.embed(in);
  models::FluxActivations after_double = fresh(embedded);
  front.run_blocks(after_double, rope, 0, 1);

  BlockTimes out;
  out.runs = r.repeat;
  // Median of the timed runs; `prepare` (untimed) gives each run fresh inputs, as the blocks write into them.
  auto median_ms = [&](auto prepare, auto run) {
    std::vector<double> times;
    for (int i = 0; i < r.warmup + r.repeat; ++i) {
      const bool out_of_time = r.max_seconds > 0 && seconds_since(started) > r.max_seconds;
      if (out_of_time && !times.empty()) break;
      auto input = prepare();
      synchronize(r.device);
      const auto t0 = Clock::now();
      run(input);
      synchronize(r.device);
      if (i >= r.warmup || out_of_time) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    out.runs = std::min(out.runs, static_cast<int>(times.size()));
    std::sort(times.begin(), times.end());
    const size_t n = times.size();
    return n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  };
  auto none = [] { return 0; };
  out.embedders_ms = median_ms(none, [&](int) { (void)front.embed(in); });
  out.double_block_ms = median_ms([&] { return fresh(embedded); },
                                  [&](models::FluxActivations& s) { front.run_blocks(s, rope, 0, 1); });
  out.single_block_ms = median_ms([&] { return fresh(after_double); },
                                  [&](models::FluxActivations& s) { back.run_blocks(s, rope, first_single, first_single + 1); });
  out.output_ms = median_ms(none, [&](int) { (void)back.head(after_double); });
  return out;
}

}  // namespace dp::pipeline
