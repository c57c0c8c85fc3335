#include "pipeline/flux_pipeline.h"

#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <utility>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "core/memory_stats.h"
#include "models/clip/clip_text_model.h"
#include "models/component_check.h"
#include "tokenizers/clip_tokenizer.h"
#include "schedulers/flow_match_scheduler.h"
#include "models/flux/flux_transformer.h"
#include "models/t5/t5_encoder.h"
#include "tokenizers/t5_tokenizer.h"
#include "models/vae/vae.h"
#include "pipeline/denoise_loop.h"
#include "pipeline/device_stats.h"
#include "pipeline/finite_check.h"
#include "pipeline/flux_stage.h"
#include "pipeline/stage_timer.h"

namespace fs = std::filesystem;

namespace dp::pipeline {
namespace {

at::Tensor ids_tensor(const std::vector<std::vector<int64_t>>& rows) {
  const int64_t b = static_cast<int64_t>(rows.size()), n = static_cast<int64_t>(rows.front().size());
  at::Tensor ids = at::empty({b, n}, at::kLong);
  for (int64_t i = 0; i < b; ++i) std::copy(rows[i].begin(), rows[i].end(), ids[i].data_ptr<int64_t>());
  return ids;
}

// Each prompt's rows repeated num_images_per_prompt times in a row, as diffusers' repeat + view does.
at::Tensor repeat_per_prompt(const at::Tensor& x, int n) { return x.repeat_interleave(n, 0); }

}  // namespace

void GenerateRequest::validate() const {
  DP_CHECK(!prompts.empty(), "no prompt given");
  DP_CHECK(num_images_per_prompt >= 1 && num_images_per_prompt <= kMaxImages,
           "--num-images-per-prompt must be in [1, ", kMaxImages, "], got ", num_images_per_prompt);
  DP_CHECK(batch() <= kMaxImages, "at most ", kMaxImages, " images per run (they run as one batch): ",
           prompts.size(), " prompt(s) x ", num_images_per_prompt, " image(s) per prompt = ", batch());
  DP_CHECK(steps >= 1 && steps <= kMaxSteps, "--steps must be in [1, ", kMaxSteps, "], got ", steps);
  DP_CHECK(std::isfinite(guidance), "--guidance must be a finite number, got ", guidance);
  DP_CHECK(max_sequence_length >= 1 && max_sequence_length <= 512,
           "--max-sequence-length must be in [1, 512] (FluxPipeline's cap), got ", max_sequence_length);
  // Rounding to the VAE's scale factor waits for the model folder (resolve_image_size); 0 means its default.
  DP_CHECK(height >= 0, "--height must be positive (or left out for the model's default), got ", height);
  DP_CHECK(width >= 0, "--width must be positive (or left out for the model's default), got ", width);
  DP_CHECK(height <= kMaxImageSide && width <= kMaxImageSide, "--height and --width must be at most ", kMaxImageSide,
           " pixels, got ", height, "x", width);
}

FluxPipeline::FluxPipeline(io::ModelFolder folder) : folder_(std::move(folder)) {}

void FluxPipeline::check_components(bool decode) const {
  const auto started = std::chrono::steady_clock::now();
  models::throw_if_problems(models::check_flux_pipeline(folder_, decode), folder_.dir());
  DP_DEBUG("preflight: configs and weight headers of ", folder_.dir(), " checked in ", std::fixed,
           std::setprecision(1), seconds_since(started) * 1000, " ms");
}

int64_t FluxPipeline::vae_scale_factor() const {
  if (!folder_.has("vae")) return kVaeScaleFactorWithoutVae;
  const auto config_path = folder_.component("vae").path + "/config.json";
  return models::VaeConfig::from_json(read_json_file(config_path), config_path).spatial_scale();
}

LatentGrid FluxPipeline::resolve_image_size(GenerateRequest& request) const {
  const int64_t factor = vae_scale_factor();
  if (request.height == 0) request.height = default_image_size(factor);
  if (request.width == 0) request.width = default_image_size(factor);
  return latent_grid(request.height, request.width, factor);
}

PromptEmbeddings FluxPipeline::encode_prompts(const GenerateRequest& request) {
  StageTimer timer("encode", request.device, &reports_);
  at::Tensor pooled = encode_clip_pooled(request, request.device, timer);
  at::Tensor t5 = encode_t5(request, request.device, timer);
  return expand_per_image(request, std::move(pooled), std::move(t5));
}

namespace {

// Runs `forward` on the token rows kEncodeChunk prompts at a time and gathers the outputs on the host.
template <typename Forward>
at::Tensor encode_in_chunks(const std::vector<std::vector<int64_t>>& rows, const at::Device& device, Forward&& forward) {
  std::vector<at::Tensor> parts;
  const auto count = static_cast<int64_t>(rows.size());
  for (int64_t first = 0; first < count; first += FluxPipeline::kEncodeChunk) {
    const int64_t last = std::min(count, first + FluxPipeline::kEncodeChunk);
    const std::vector<std::vector<int64_t>> chunk(rows.begin() + first, rows.begin() + last);
    parts.push_back(forward(ids_tensor(chunk).to(device)).to(at::kCPU));
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, 0);
}

}  // namespace

at::Tensor FluxPipeline::encode_clip_pooled(const GenerateRequest& request, const at::Device& device,
                                            StageTimer& timer) {
  c10::InferenceMode guard;
  const auto rows = timer.timed("CLIP tokenizer", [&] {
    const auto tokenizer = tokenizers::ClipTokenizer::from_folder(folder_.component("tokenizer").path);
    std::vector<std::vector<int64_t>> ids;
    for (const auto& prompt : request.prompts) ids.push_back(tokenizer.encode_padded(prompt));
    return ids;
  });
  const auto clip = timer.loading("CLIP load", [&] {
    return models::ClipTextModel::load(folder_.component("text_encoder").path, request.dtype, device);
  });
  return timer.timed("CLIP forward", [&] {
    return encode_in_chunks(rows, device, [&](const at::Tensor& ids) { return clip.forward(ids).pooled_output; });
  });
}  // CLIP released here

at::Tensor FluxPipeline::encode_t5(const GenerateRequest& request, const at::Device& device, StageTimer& timer) {
  c10::InferenceMode guard;
  const auto rows = timer.timed("T5 tokenizer", [&] {
    const auto tokenizer = tokenizers::T5Tokenizer::from_folder(folder_.component("tokenizer_2").path);
    std::vector<std::vector<int64_t>> ids;
    for (const auto& prompt : request.prompts) ids.push_back(tokenizer.encode_padded(prompt, request.max_sequence_length));
    return ids;
  });
  const auto t5 = timer.loading("T5 load", [&] {
    return models::T5Encoder::load(folder_.component("text_encoder_2").path, request.dtype, device);
  });
  return timer.timed("T5 forward", [&] {
    return encode_in_chunks(rows, device, [&](const at::Tensor& ids) { return t5.forward(ids); });
  });
}  // T5 released here

PromptEmbeddings FluxPipeline::expand_per_image(const GenerateRequest& request, at::Tensor pooled, at::Tensor t5) {
  DP_CHECK(pooled.size(0) == static_cast<int64_t>(request.prompts.size()) && t5.size(0) == pooled.size(0),
           "prompt embeddings for ", pooled.size(0), " (CLIP) and ", t5.size(0), " (T5) prompts, expected ",
           request.prompts.size());
  PromptEmbeddings out;
  out.pooled = repeat_per_prompt(pooled, request.num_images_per_prompt);
  out.prompt_embeds = repeat_per_prompt(t5, request.num_images_per_prompt);
  out.text_ids = at::zeros({request.max_sequence_length, 3});
  return out;
}

at::Tensor FluxPipeline::initial_latents(const GenerateRequest& request, const LatentGrid& grid) const {
  c10::InferenceMode guard;
  const auto config_path = folder_.component("transformer").path + "/config.json";
  const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
  DP_CHECK(config.in_channels % 4 == 0, config_path, ": in_channels ", config.in_channels,
           " is not 4 x latent channels");
  // diffusers draws on the CPU generator in the run dtype, then moves the result to the device.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(request.seed);
  const at::Tensor noise = at::randn({request.batch(), config.in_channels / 4, grid.height, grid.width}, generator,
                                     at::TensorOptions().dtype(request.dtype));
  return pack_latents(noise).to(request.device);
}

at::Tensor FluxPipeline::denoise(const GenerateRequest& request, const LatentGrid& grid,
                                 const PromptEmbeddings& prompts, at::Tensor latents,
                                 const std::function<void(const StepProgress&)>& on_step) {
  StageTimer timer("denoise", request.device, &reports_);
  const DenoiseSchedule schedule = this->schedule(request, latents.size(1));
  auto stage = timer.loading("transformer load", [&] {
    return std::make_shared<FluxStage>(folder_.component("transformer").path, 0, -1, request.dtype, request.device,
                                       grid, prompts.prompt_embeds.size(1));
  });
  LocalExecutor executor(stage);
  DenoiseJob job;
  job.latents = latents;
  job.prompt_embeds = prompts.prompt_embeds;
  job.pooled = prompts.pooled;
  job.guidance = request.guidance;
  job.guidance_embeds = schedule.guidance_embeds;
  job.microbatch_size = latents.size(0);  // the whole batch at once, as FluxPipeline runs it
  job.scheduler = &schedule.scheduler;
  LoopCallbacks callbacks;
  const int steps = schedule.scheduler.num_inference_steps();
  callbacks.check_step = [steps](int64_t, int step, const at::Tensor& stepped) {
    check_step_latents(stepped, {step + 1, steps, ""});
  };
  if (on_step) {
    callbacks.on_step = [&](const LoopProgress& p) {
      synchronize(request.device);
      on_step({p.step, p.steps, p.elapsed_seconds});
    };
  }
  return run_denoise_loop(job, executor, callbacks);
}

DenoiseSchedule FluxPipeline::schedule(const GenerateRequest& request, int64_t image_tokens) const {
  const auto scheduler_dir = folder_.component("scheduler").path;
  const auto scheduler_config = schedulers::FlowMatchSchedulerConfig::from_file(scheduler_dir + "/scheduler_config.json");
  DenoiseSchedule out{schedulers::FlowMatchEulerScheduler(scheduler_config), false};
  const double mu = schedulers::flux_calculate_shift(image_tokens, scheduler_config);
  out.scheduler.set_timesteps_from_sigmas(schedulers::flux_default_sigmas(request.steps), &mu);
  const auto config_path = folder_.component("transformer").path + "/config.json";
  out.guidance_embeds = models::FluxConfig::from_json(read_json_file(config_path), config_path).guidance_embeds;
  return out;
}

at::Tensor FluxPipeline::decode(const GenerateRequest& request, const LatentGrid& grid, const at::Tensor& latents) {
  c10::InferenceMode guard;
  StageTimer timer("decode", request.device, &reports_);
  const auto vae = timer.loading("VAE load", [&] { return load_vae(request, grid, request.device); });
  return timer.timed("VAE decode", [&] { return decode_with(vae, grid, latents); });
}

models::AutoencoderKL FluxPipeline::load_vae(const GenerateRequest& request, const LatentGrid& grid,
                                             const at::Device& device) const {
  auto vae = models::AutoencoderKL::load(folder_.component("vae").path, request.dtype, device);
  DP_CHECK(vae.config().spatial_scale() == grid.vae_scale_factor, folder_.component("vae").path,
           ": the VAE scales by ", vae.config().spatial_scale(), " but the latent grid was laid out for ",
           grid.vae_scale_factor);
  return vae;
}

at::Tensor FluxPipeline::decode_with(const models::AutoencoderKL& vae, const LatentGrid& grid, const at::Tensor& latents) {
  c10::InferenceMode guard;
  const at::Tensor z = vae.unscale_latents(unpack_latents(latents.to(vae.device()), grid));
  const at::Tensor image = vae.decode(z);
  // diffusers' postprocess: denormalise and clamp in the run dtype, then float, *255, round, uint8.
  const at::Tensor unit = (image / 2 + 0.5).clamp(0, 1);
  return (unit.permute({0, 2, 3, 1}).to(at::kCPU, at::kFloat) * 255).round().to(at::kByte).contiguous();
}

}  // namespace dp::pipeline
