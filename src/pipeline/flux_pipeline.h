#pragma once
// FluxPipeline.__call__ as diffusers runs it, split into the stages the runtime schedules separately:
// encode prompts (CLIP + T5), draw latents, denoise with the transformer, decode with the VAE. Each stage
// loads its components, runs, and releases them, so peak memory is the largest stage, not the sum.
// One-process and multi-rank runs share this code; the runtime only replaces how denoise reaches the
// transformer blocks.
#include <ATen/ATen.h>

#include <functional>
#include <future>
#include <string>
#include <vector>

#include "io/model_folder.h"
#include "models/lora.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/vae.h"
#include "pipeline/denoise_loop.h"
#include "pipeline/latent_layout.h"
#include "schedulers/flow_match_scheduler.h"

namespace dp::pipeline {

class StageTimer;  // stage_timer.h

struct GenerateRequest {
  // Hard limits, stated in `generate --help`. The memory estimate (memory_estimate.h) refuses most requests
  // that are too large long before these; they bound what no estimate covers (time) and keep every size
  // computation far from overflow.
  static constexpr int kMaxSteps = 1000;            // the scheduler's training timesteps
  static constexpr int kMaxImages = 256;            // prompts x images per prompt: one batch
  static constexpr int64_t kMaxImageSide = 1000000;  // pixels; libpng's default limit for readers

  std::vector<std::string> prompts;
  int num_images_per_prompt = 1;
  // 0: the pipeline's default, default_sample_size x the VAE's scale factor (1024 for FLUX.1), which
  // FluxPipeline::resolve_image_size fills in, as diffusers does for height=None (or 0).
  int64_t height = 0;
  int64_t width = 0;
  int steps = 28;
  double guidance = 3.5;
  uint64_t seed = 0;
  int max_sequence_length = 512;
  at::ScalarType dtype = at::kBFloat16;
  at::Device device = at::kCPU;
  // True classifier-free guidance, FluxPipeline's negative_prompt + true_cfg_scale: on when true_cfg_scale > 1
  // and a negative prompt is given (one for every prompt, or one per prompt); each step then also runs the
  // negative prompt and takes uncond + true_cfg_scale * (cond - uncond).
  std::vector<std::string> negative_prompts;
  double true_cfg_scale = 1.0;
  // FluxPipeline's `sigmas`: a custom schedule (before the scheduler's shift), one per step; empty: the default.
  std::vector<double> sigmas;
  // FluxPipeline's `latents`: the initial packed latents (B, N_img, C) on the host; undefined: drawn from `seed`.
  at::Tensor latents;
  std::string latents_source;  // where they came from, for messages
  // LoRA adapters (null: none). With prompts that choose their adapters (pipeline/prompt_adapters.h), `prompts`
  // keep their tags as written and `prompt_texts` / `prompt_adapters` hold each text and its choice (an index
  // into lora->selections()); both empty otherwise.
  std::shared_ptr<const models::LoraSet> lora;
  std::vector<std::string> prompt_texts;
  std::vector<int64_t> prompt_adapters;

  int64_t batch() const { return static_cast<int64_t>(prompts.size()) * num_images_per_prompt; }
  bool do_true_cfg() const { return true_cfg_scale > 1 && !negative_prompts.empty(); }
  const std::string& prompt_text(size_t prompt) const;
  int64_t prompt_adapter_choice(size_t prompt) const;
  // What CLIP and T5 encode: every prompt's text, then (with true CFG) each distinct negative prompt with the
  // adapter choice of the prompts it serves, in order of first use.
  struct EncodeText {
    std::string text;
    int64_t adapters = 0;
  };
  std::vector<EncodeText> encode_texts() const;
  // The row of encode_texts() holding prompt `prompt`'s negative prompt.
  size_t negative_row(size_t prompt) const;
  // True CFG, custom sigmas, initial latents and adapters in a short text that ranks compare ("" when unused).
  std::string extras_digest() const;
  void validate() const;  // throws naming the offending value
};

struct PromptEmbeddings {
  at::Tensor prompt_embeds;  // (B * n, max_sequence_length, joint_attention_dim), T5 last hidden state
  at::Tensor pooled;         // (B * n, pooled_projection_dim), CLIP pooled output
  at::Tensor text_ids;       // (max_sequence_length, 3), zeros
  // With true CFG: the negative prompt's, one row per image as above; undefined otherwise.
  at::Tensor negative_prompt_embeds;
  at::Tensor negative_pooled;
};

struct StageReport {
  std::string name;
  double seconds = 0;
  double load_seconds = 0;           // part of `seconds` spent reading this stage's weights onto the device
  uint64_t peak_resident_bytes = 0;  // process peak RSS while the stage ran
  uint64_t peak_device_bytes = 0;    // CUDA allocator peak, 0 on CPU
};

struct StepProgress {
  int step = 0;  // 1-based
  int steps = 0;
  double elapsed_seconds = 0;
};

// The denoising schedule of a request: the scheduler with FluxPipeline's sigmas and shift set, and whether the
// transformer takes guidance as an input.
struct DenoiseSchedule {
  schedulers::FlowMatchEulerScheduler scheduler;
  bool guidance_embeds = false;
};

// The denoising loop's job for a request (pipeline/denoise_loop.h): the batch's latents and embeddings, the
// guidance, true CFG's negative embeddings and scale, and each image's adapter choice when prompts choose.
DenoiseJob make_denoise_job(const GenerateRequest& request, const PromptEmbeddings& prompts, const at::Tensor& latents,
                            const DenoiseSchedule& schedule, int64_t microbatch_size);

class FluxPipeline {
 public:
  explicit FluxPipeline(io::ModelFolder folder);

  const io::ModelFolder& folder() const { return folder_; }
  // The preflight, before any compute: every component the run needs is present, each config parses, and
  // each safetensors header holds the tensors the config implies, with their shapes (the VAE's decoder
  // only, and only when `decode`). Reads headers only, in milliseconds; throws naming every problem's file
  // and field or tensor (models::check_flux_pipeline), so a broken folder fails before minutes of work.
  void check_components(bool decode) const;
  // FluxPipeline.vae_scale_factor: 2 ** (len(block_out_channels) - 1) from vae/config.json, or 8 when the
  // folder has no VAE. Reads the config only, so latent-only runs learn it without loading the VAE.
  int64_t vae_scale_factor() const;
  // Fills in a height or width left at 0 with the default size and returns the latent grid; a size that
  // is not a multiple of 2 x vae_scale_factor is rounded down with diffusers' warning.
  LatentGrid resolve_image_size(GenerateRequest& request) const;

  PromptEmbeddings encode_prompts(const GenerateRequest& request);
  // The encode phase's two halves, each runnable on its own rank and device: one row per prompt (not yet
  // repeated per image), returned on the host. Prompts go through the encoder kEncodeChunk at a time, so a
  // prompts file of hundreds holds one chunk's activations on the device, not all of them.
  static constexpr int64_t kEncodeChunk = 16;
  // Their parts are timed within `timer`, the encode stage of whichever rank runs them.
  // `after_load` runs once CLIP's weights are in, before its forward (encode_both starts T5 there).
  at::Tensor encode_clip_pooled(const GenerateRequest& request, const at::Device& device, StageTimer& timer,
                                const std::function<void()>& after_load = nullptr);
  at::Tensor encode_t5(const GenerateRequest& request, const at::Device& device, StageTimer& timer);
  // Both on one device, with the same results: on CUDA, T5's weights load on a thread while CLIP's forward runs.
  struct EncodedTexts {
    at::Tensor pooled;  // CLIP's
    at::Tensor t5;
  };
  // `weights_in` runs once both encoders' weights are on the device (on the thread that loaded T5's), for a
  // load that should not compete with theirs (runtime/load_phase.h).
  EncodedTexts encode_both(const GenerateRequest& request, const at::Device& device, StageTimer& timer,
                           const std::function<void()>& weights_in = nullptr);
  // On CUDA the text encoders' first forwards pay the process's first-use cost (kernel modules, cuBLAS and cuDNN
  // handles): 0.6-0.9 s of CLIP's and T5's forwards on an H200 (bench/RESULTS.md, 2026-12-05). Called as soon as
  // the device is known, this runs the forward of CLIP (`clip`) and then of T5 (`t5`), the encoders this rank
  // runs, on zero weights at the request's shapes on a thread, while the run's checks and the weights' reading
  // go on; the real forwards then find that work done (CLIP's forward waits for a warm-up of CLIP alone;
  // start_t5 takes over one that includes T5, and T5's forward waits for it). Nothing happens off CUDA. A
  // failure only logs: the real forwards report what is wrong, if anything is.
  void start_encoder_warm_up(const GenerateRequest& request, const at::Device& device, bool clip = true,
                             bool t5 = true);
  // The rows of encode_texts() (pooled from CLIP, t5 from T5) as one row per image: each prompt's repeated
  // num_images_per_prompt times in a row, as diffusers' repeat + view does, and the same for the negatives.
  static PromptEmbeddings expand_per_image(const GenerateRequest& request, at::Tensor pooled, at::Tensor t5);
  // randn in the run dtype from a CPU generator seeded with request.seed, then packed: (B * n, seq, 4C).
  at::Tensor initial_latents(const GenerateRequest& request, const LatentGrid& grid) const;
  at::Tensor denoise(const GenerateRequest& request, const LatentGrid& grid, const PromptEmbeddings& prompts,
                     at::Tensor latents, const std::function<void(const StepProgress&)>& on_step);
  // The schedule for `image_tokens` latent tokens (configs only: no weights are read): FluxPipeline's default
  // sigmas, or the request's custom ones, shifted as the scheduler config says.
  DenoiseSchedule schedule(const GenerateRequest& request, int64_t image_tokens) const;
  // Packed latents to 8-bit RGB images (B, H, W, 3), exactly as the PIL output of diffusers.
  //
  // Each image is decoded on its own, and on the CPU with kCpuDecodeThreads intra-op threads whatever
  // OMP_NUM_THREADS says, so that a PNG's bytes do not depend on how images were grouped into microbatches, on
  // the thread count, or on the world size (launch/mpirun.sh gives each rank cores / ranks-per-node threads):
  // oneDNN picks its convolution kernels, and with them the order of its sums, by batch size and thread count,
  // and a 1e-5 difference turns into pixels off by one. A resumed run therefore writes the same PNGs as an
  // uninterrupted one. Another CPU model (instruction set, cache sizes) may still choose other kernels.
  static constexpr int kCpuDecodeThreads = 8;
  at::Tensor decode(const GenerateRequest& request, const LatentGrid& grid, const at::Tensor& latents);
  // decode() in two parts, for a VAE that stays loaded while microbatches finish one by one.
  models::AutoencoderKL load_vae(const GenerateRequest& request, const LatentGrid& grid, const at::Device& device) const;
  static at::Tensor decode_with(const models::AutoencoderKL& vae, const LatentGrid& grid, const at::Tensor& latents);

  const std::vector<StageReport>& reports() const { return reports_; }
  // Where stages run outside this class (the runtime's denoise) record their reports.
  std::vector<StageReport>* report_sink() { return &reports_; }

 private:
  // T5's work that can start before its forward: the tokenizer, the warm-up (CUDA) and, when asked, the weights.
  struct T5Start {
    std::future<std::vector<std::vector<int64_t>>> tokens;
    std::future<void> warming;
    std::future<models::T5Encoder> weights;  // invalid: finish_t5 loads them
  };
  T5Start start_t5(const GenerateRequest& request, const at::Device& device, bool load_weights,
                   const std::function<void()>& weights_in = nullptr);
  at::Tensor finish_t5(const GenerateRequest& request, const at::Device& device, StageTimer& timer, T5Start start,
                       const std::function<void()>& weights_in = nullptr);

  io::ModelFolder folder_;
  std::vector<StageReport> reports_;
  std::future<void> encoder_warm_up_;  // start_encoder_warm_up's thread, until start_t5 or CLIP's forward takes it
  bool encoder_warm_up_has_t5_ = false;
};

}  // namespace dp::pipeline
