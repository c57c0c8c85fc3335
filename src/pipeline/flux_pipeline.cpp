#include "pipeline/flux_pipeline.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <future>
#include <iomanip>
#include <map>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/human_units.h"
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
#include "pipeline/encoder_warm_up.h"
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
  DP_CHECK(std::isfinite(true_cfg_scale), "--true-cfg-scale must be a finite number, got ", true_cfg_scale);
  DP_CHECK(negative_prompts.empty() || negative_prompts.size() == 1 || negative_prompts.size() == prompts.size(),
           negative_prompts.size(), " negative prompts for ", prompts.size(),
           " prompts: give one --negative-prompt for all of them, or one per prompt");
  if (!sigmas.empty()) {
    // FluxPipeline runs len(sigmas) steps; a sigma is a noise level, where NaN or a value outside [0, 1] gives
    // NaN or meaningless latents rather than an error in diffusers.
    DP_CHECK(static_cast<int>(sigmas.size()) == steps, "--sigmas gives ", sigmas.size(), " values but --steps is ",
             steps, " (FluxPipeline runs one step per sigma; leave --steps out)");
    for (size_t i = 0; i < sigmas.size(); ++i)
      DP_CHECK(std::isfinite(sigmas[i]) && sigmas[i] >= 0 && sigmas[i] <= 1, "--sigmas value ", i + 1, " is ",
               sigmas[i], "; each sigma must be a noise level in [0, 1]");
  }
  if (latents.defined()) {
    DP_CHECK(latents.dim() == 3 && latents.size(0) == batch() && at::isFloatingType(latents.scalar_type()),
             latents_source, ": initial latents must be packed (batch, tokens, channels) with batch ", batch(),
             " (prompts x images per prompt), got ", latents.sizes(), " ", latents.scalar_type());
    DP_CHECK(at::isfinite(latents).all().item<bool>(), latents_source, ": the initial latents hold NaN or infinity");
  }
  DP_CHECK(prompt_texts.empty() || prompt_texts.size() == prompts.size(), "prompt texts for ", prompt_texts.size(),
           " of ", prompts.size(), " prompts");
  DP_CHECK(prompt_adapters.empty() || prompt_adapters.size() == prompts.size(), "adapter choices for ",
           prompt_adapters.size(), " of ", prompts.size(), " prompts");
}

const std::string& GenerateRequest::prompt_text(size_t prompt) const {
  return prompt_texts.empty() ? prompts.at(prompt) : prompt_texts.at(prompt);
}

int64_t GenerateRequest::prompt_adapter_choice(size_t prompt) const {
  return prompt_adapters.empty() ? 0 : prompt_adapters.at(prompt);
}

std::vector<GenerateRequest::EncodeText> GenerateRequest::encode_texts() const {
  std::vector<EncodeText> texts;
  for (size_t p = 0; p < prompts.size(); ++p) texts.push_back({prompt_text(p), prompt_adapter_choice(p)});
  if (!do_true_cfg()) return texts;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const EncodeText negative{negative_prompts.size() == 1 ? negative_prompts[0] : negative_prompts.at(p),
                              prompt_adapter_choice(p)};
    const auto same = [&](const EncodeText& t) { return t.text == negative.text && t.adapters == negative.adapters; };
    if (std::find_if(texts.begin() + static_cast<int64_t>(prompts.size()), texts.end(), same) == texts.end())
      texts.push_back(negative);
  }
  return texts;
}

size_t GenerateRequest::negative_row(size_t prompt) const {
  const auto texts = encode_texts();
  const std::string& text = negative_prompts.size() == 1 ? negative_prompts[0] : negative_prompts.at(prompt);
  for (size_t row = prompts.size(); row < texts.size(); ++row)
    if (texts[row].text == text && texts[row].adapters == prompt_adapter_choice(prompt)) return row;
  DP_FAIL("prompt ", prompt, " has no negative prompt row (true CFG is ", do_true_cfg() ? "on" : "off", ")");
}

std::string GenerateRequest::extras_digest() const {
  std::string text;
  if (do_true_cfg()) {
    text += str(", true CFG ", true_cfg_scale, " with ", negative_prompts.size(), " negative prompt(s):");
    for (const auto& n : negative_prompts) text += " \"" + n.substr(0, 40) + "\" (" + std::to_string(n.size()) + " bytes)";
  }
  if (!sigmas.empty()) {
    text += ", sigmas";
    for (double s : sigmas) text += str(" ", s);
  }
  if (latents.defined() || !latents_source.empty()) text += ", latents " + latents_source;
  if (lora) {
    text += ", LoRA " + lora->fingerprint() + " choices";
    for (int64_t c : prompt_adapters) text += " " + std::to_string(c);
  }
  return text;
}

DenoiseJob make_denoise_job(const GenerateRequest& request, const PromptEmbeddings& prompts, const at::Tensor& latents,
                            const DenoiseSchedule& schedule, int64_t microbatch_size) {
  DenoiseJob job;
  job.latents = latents;
  job.prompt_embeds = prompts.prompt_embeds;
  job.pooled = prompts.pooled;
  job.guidance = request.guidance;
  job.guidance_embeds = schedule.guidance_embeds;
  job.microbatch_size = microbatch_size;
  job.scheduler = &schedule.scheduler;
  if (request.do_true_cfg()) {
    DP_CHECK(prompts.negative_prompt_embeds.defined() && prompts.negative_pooled.defined(),
             "true CFG needs the negative prompt's embeddings");
    job.negative_prompt_embeds = prompts.negative_prompt_embeds;
    job.negative_pooled = prompts.negative_pooled;
    job.true_cfg_scale = request.true_cfg_scale;
  }
  // Each image's adapter choice travels with its microbatch only when the prompts choose differently.
  const bool choices = std::any_of(request.prompt_adapters.begin(), request.prompt_adapters.end(),
                                   [](int64_t c) { return c != 0; });
  if (choices) {
    std::vector<int64_t> per_image;
    for (size_t p = 0; p < request.prompts.size(); ++p)
      for (int n = 0; n < request.num_images_per_prompt; ++n) per_image.push_back(request.prompt_adapter_choice(p));
    job.adapter_choices = at::tensor(per_image, at::TensorOptions().dtype(at::kLong)).to(latents.device());
  }
  return job;
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
  EncodedTexts encoded = encode_both(request, request.device, timer);
  return expand_per_image(request, std::move(encoded.pooled), std::move(encoded.t5));
}

namespace {

// Runs `forward` on the token rows kEncodeChunk prompts at a time and gathers the outputs on the host. The ids
// stay on the host: the encoders check their range and find CLIP's pooled rows there, and move them to their
// device themselves (on the device the checks' reductions and the argmax were 0.1-0.2 s of first use on CUDA).
template <typename Forward>
at::Tensor encode_in_chunks(const std::vector<std::vector<int64_t>>& rows, Forward&& forward) {
  std::vector<at::Tensor> parts;
  const auto count = static_cast<int64_t>(rows.size());
  for (int64_t first = 0; first < count; first += FluxPipeline::kEncodeChunk) {
    const int64_t last = std::min(count, first + FluxPipeline::kEncodeChunk);
    const std::vector<std::vector<int64_t>> chunk(rows.begin() + first, rows.begin() + last);
    parts.push_back(forward(ids_tensor(chunk)).to(at::kCPU));
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, 0);
}

}  // namespace

at::Tensor FluxPipeline::encode_clip_pooled(const GenerateRequest& request, const at::Device& device,
                                            StageTimer& timer, const std::function<void()>& after_load) {
  c10::InferenceMode guard;
  const auto texts = request.encode_texts();
  // The tokenizer reads its files (tens of milliseconds at CLIP's full vocabulary) while the weights load.
  auto tokenizing = std::async(std::launch::async, [&] {
    const auto tokenizer = tokenizers::ClipTokenizer::from_folder(folder_.component("tokenizer").path);
    std::vector<std::vector<int64_t>> ids;
    for (const auto& text : texts) ids.push_back(tokenizer.encode_padded(text.text));
    return ids;
  });
  const auto clip = timer.loading("CLIP load", [&] {
    return models::ClipTextModel::load(folder_.component("text_encoder").path, request.dtype, device, request.lora);
  });
  if (after_load) after_load();
  // A warm-up of CLIP alone (this rank runs no T5) is waited for, so that the forward finds its kernels loaded
  // rather than loading them beside it; one that goes on to T5 is left to start_t5.
  if (encoder_warm_up_.valid() && !encoder_warm_up_has_t5_)
    timer.timed("CLIP warm-up (the rest)", [&] { encoder_warm_up_.get(); return 0; });
  const auto rows = timer.timed("CLIP tokenizer (the rest)", [&] { return tokenizing.get(); });
  return timer.timed("CLIP forward", [&] {
    int64_t first = 0;
    return encode_in_chunks(rows, [&](const at::Tensor& ids) {
      // Unfused text-encoder adapters: each row with its prompt's choice.
      std::vector<int64_t> choices;
      for (int64_t r = 0; r < ids.size(0); ++r) choices.push_back(texts[static_cast<size_t>(first + r)].adapters);
      first += ids.size(0);
      clip.select_adapters(choices);
      return clip.forward(ids).pooled_output;
    });
  });
}  // CLIP released here

void FluxPipeline::start_encoder_warm_up(const GenerateRequest& request, const at::Device& device, bool clip,
                                         bool t5) {
  if (!device.is_cuda() || encoder_warm_up_.valid() || (!clip && !t5)) return;
  const auto rows = std::min<int64_t>(static_cast<int64_t>(request.encode_texts().size()), kEncodeChunk);
  encoder_warm_up_has_t5_ = t5;
  encoder_warm_up_ = std::async(std::launch::async, [folder = folder_, rows, device, dtype = request.dtype, clip, t5,
                                                     seq = static_cast<int64_t>(request.max_sequence_length)] {
    c10::OptionalDeviceGuard device_guard(device);
    try {
      std::string done;
      if (clip) {
        const std::string path = folder.component("text_encoder").path + "/config.json";
        const auto config = models::ClipTextConfig::from_json(read_json_file(path), path);
        done = str("CLIP's forward in ", human_seconds(models::ClipTextModel::warm_up(config, dtype, device, rows)));
      }
      if (t5) {
        const std::string path = folder.component("text_encoder_2").path + "/config.json";
        const auto config = models::T5Config::from_json(read_json_file(path), path);
        done += str(done.empty() ? "" : ", then ", "T5's in ",
                    human_seconds(models::T5Encoder::warm_up(config, dtype, device, rows, seq)));
      }
      DP_INFO("text encoders: warmed up ", done, ", beside the run's checks and loading");
    } catch (const std::exception& e) {
      DP_DEBUG("text encoders: early warm-up stopped, their first forwards pay the first-use cost: ", e.what());
    }
  });
}

FluxPipeline::T5Start FluxPipeline::start_t5(const GenerateRequest& request, const at::Device& device,
                                              bool load_weights, const std::function<void()>& weights_in) {
  T5Start start;
  // As for CLIP: the tokenizer works while the weights load (and the warm-up runs).
  start.tokens = std::async(std::launch::async, [this, &request] {
    const auto tokenizer = tokenizers::T5Tokenizer::from_folder(folder_.component("tokenizer_2").path);
    std::vector<std::vector<int64_t>> ids;
    for (const auto& text : request.encode_texts()) ids.push_back(tokenizer.encode_padded(text.text, request.max_sequence_length));
    return ids;
  });
  // On CUDA, T5's first forward would load its kernels and create its handles: done on a thread while the
  // weights stream, with one block of zeros at the run's shape.
  if (encoder_warm_up_.valid()) {
    start.warming = std::move(encoder_warm_up_);  // T5's part of it is what its forward needs
  } else if (device.is_cuda() && encoder_warm_up_enabled()) {
    const std::string config_path = folder_.component("text_encoder_2").path + "/config.json";
    const auto config = models::T5Config::from_json(read_json_file(config_path), config_path);
    const auto rows = std::min<int64_t>(static_cast<int64_t>(request.encode_texts().size()), kEncodeChunk);
    start.warming = std::async(std::launch::async, [config, rows, device, dtype = request.dtype,
                                                    seq = static_cast<int64_t>(request.max_sequence_length)] {
      c10::OptionalDeviceGuard device_guard(device);
      try {
        const double seconds = models::T5Encoder::warm_up(config, dtype, device, rows, seq);
        DP_INFO("T5: warmed up its forward while its weights loaded, in ", std::fixed, std::setprecision(3), seconds,
                " s");
      } catch (const std::exception& e) {
        // Only a head start: the real forward will say what is wrong, if anything is.
        DP_WARN("T5: warm-up failed, the first forward pays its first-use cost: ", e.what());
      }
    });
  }
  if (load_weights) {
    start.weights = std::async(std::launch::async, [this, device, dtype = request.dtype, weights_in] {
      c10::InferenceMode inference;  // per thread, as is the device guard
      c10::OptionalDeviceGuard device_guard(device);
      auto t5 = models::T5Encoder::load(folder_.component("text_encoder_2").path, dtype, device);
      if (weights_in) weights_in();
      return t5;
    });
  }
  return start;
}

at::Tensor FluxPipeline::encode_t5(const GenerateRequest& request, const at::Device& device, StageTimer& timer) {
  return finish_t5(request, device, timer, start_t5(request, device, false));
}

at::Tensor FluxPipeline::finish_t5(const GenerateRequest& request, const at::Device& device, StageTimer& timer,
                                   T5Start start, const std::function<void()>& weights_in) {
  c10::InferenceMode guard;
  const bool loaded_beside = start.weights.valid();
  const auto t5 = loaded_beside
                      ? timer.loading("T5 load (the rest: it loaded beside CLIP)", [&] { return start.weights.get(); })
                      : timer.loading("T5 load", [&] {
                          return models::T5Encoder::load(folder_.component("text_encoder_2").path, request.dtype,
                                                         device);
                        });
  if (!loaded_beside && weights_in) weights_in();
  if (start.warming.valid()) timer.timed("T5 warm-up (the rest)", [&] { start.warming.get(); return 0; });
  const auto rows = timer.timed("T5 tokenizer (the rest)", [&] { return start.tokens.get(); });
  return timer.timed("T5 forward", [&] {
    return encode_in_chunks(rows, [&](const at::Tensor& ids) { return t5.forward(ids); });
  });
}  // T5 released here

FluxPipeline::EncodedTexts FluxPipeline::encode_both(const GenerateRequest& request, const at::Device& device,
                                                     StageTimer& timer, const std::function<void()>& weights_in) {
  EncodedTexts out;
  if (!device.is_cuda()) {
    // On the CPU the two would share the same cores (and the CPU kernels' sums depend on the threads they get).
    out.pooled = encode_clip_pooled(request, device, timer);
    out.t5 = finish_t5(request, device, timer, start_t5(request, device, false), weights_in);
    return out;
  }
  // On CUDA, CLIP's forward is the process's first GEMMs and kernels (0.6-1.4 s of first-use cost on an H200,
  // bench/RESULTS.md 2026-12-05): T5's weights are read meanwhile, once CLIP's own are in.
  std::optional<T5Start> t5;
  out.pooled = encode_clip_pooled(request, device, timer,
                                  [&] { t5.emplace(start_t5(request, device, true, weights_in)); });
  if (!t5) t5.emplace(start_t5(request, device, true, weights_in));
  out.t5 = finish_t5(request, device, timer, std::move(*t5));
  return out;
}

PromptEmbeddings FluxPipeline::expand_per_image(const GenerateRequest& request, at::Tensor pooled, at::Tensor t5) {
  const auto texts = static_cast<int64_t>(request.encode_texts().size());
  DP_CHECK(pooled.size(0) == texts && t5.size(0) == texts, "prompt embeddings for ", pooled.size(0), " (CLIP) and ",
           t5.size(0), " (T5) texts, expected ", texts);
  const auto prompts = static_cast<int64_t>(request.prompts.size());
  PromptEmbeddings out;
  out.pooled = repeat_per_prompt(pooled.narrow(0, 0, prompts), request.num_images_per_prompt);
  out.prompt_embeds = repeat_per_prompt(t5.narrow(0, 0, prompts), request.num_images_per_prompt);
  out.text_ids = at::zeros({request.max_sequence_length, 3});
  if (request.do_true_cfg()) {
    std::vector<int64_t> rows;
    for (size_t p = 0; p < request.prompts.size(); ++p) rows.push_back(static_cast<int64_t>(request.negative_row(p)));
    const at::Tensor index = at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(pooled.device());
    out.negative_pooled = repeat_per_prompt(pooled.index_select(0, index), request.num_images_per_prompt);
    out.negative_prompt_embeds = repeat_per_prompt(t5.index_select(0, index.to(t5.device())), request.num_images_per_prompt);
  }
  return out;
}

at::Tensor FluxPipeline::initial_latents(const GenerateRequest& request, const LatentGrid& grid) const {
  c10::InferenceMode guard;
  const auto config_path = folder_.component("transformer").path + "/config.json";
  const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
  DP_CHECK(config.in_channels % 4 == 0, config_path, ": in_channels ", config.in_channels,
           " is not 4 x latent channels");
  if (request.latents.defined()) {
    // diffusers takes packed latents as given (latents.to(device, dtype)); the transformer would fail on any
    // other shape, so it is checked here, naming the file.
    const at::Tensor& given = request.latents;
    DP_CHECK(given.dim() == 3 && given.size(0) == request.batch() && given.size(1) == grid.tokens() &&
                 given.size(2) == config.in_channels,
             request.latents_source, ": initial latents of shape ", given.sizes(), " given, but ", request.width, "x",
             request.height, " with ", request.batch(), " image(s) needs packed latents (", request.batch(), ", ",
             grid.tokens(), ", ", config.in_channels, ")");
    return given.to(request.device, request.dtype);
  }
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
                                       grid, prompts.prompt_embeds.size(1), std::map<int64_t, models::OffloadedWeights>{},
                                       models::flux::SequenceShard{}, request.lora);
  });
  LocalExecutor executor(stage);
  // The whole batch at once, as FluxPipeline runs it.
  const DenoiseJob job = make_denoise_job(request, prompts, latents, schedule, latents.size(0));
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
  out.scheduler.set_timesteps_from_sigmas(
      request.sigmas.empty() ? schedulers::flux_default_sigmas(request.steps) : request.sigmas, &mu);
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

namespace {

// Sets this thread's intra-op thread count for its lifetime and puts the previous one back.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int threads) : previous_(at::get_num_threads()) {
    if (threads != previous_) at::set_num_threads(threads);
  }
  ~IntraOpThreads() {
    if (at::get_num_threads() != previous_) at::set_num_threads(previous_);
  }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int previous_;
};

}  // namespace

at::Tensor FluxPipeline::decode_with(const models::AutoencoderKL& vae, const LatentGrid& grid, const at::Tensor& latents) {
  c10::InferenceMode guard;
  std::optional<IntraOpThreads> threads;
  if (vae.device().is_cpu()) threads.emplace(kCpuDecodeThreads);
  std::vector<at::Tensor> images;
  images.reserve(static_cast<size_t>(latents.size(0)));
  for (int64_t i = 0; i < latents.size(0); ++i) {
    const at::Tensor z = vae.unscale_latents(unpack_latents(latents.narrow(0, i, 1).to(vae.device()), grid));
    const at::Tensor image = vae.decode(z);
    // diffusers' postprocess: denormalise and clamp in the run dtype, then float, *255, round, uint8. It runs
    // where the image is, so that only the bytes cross to the host: the same values on either side (an IEEE
    // product, round-half-to-even, an exact cast), a quarter of the bytes an fp32 copy would move.
    const at::Tensor unit = (image / 2 + 0.5).clamp(0, 1);
    const at::Tensor pixels = (unit.permute({0, 2, 3, 1}).to(at::kFloat) * 255).round().to(at::kByte);
    images.push_back(pixels.contiguous().to(at::kCPU));
  }
  return at::cat(images).contiguous();
}

}  // namespace dp::pipeline
