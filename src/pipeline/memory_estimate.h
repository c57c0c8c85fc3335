#pragma once
// How much memory a generate request needs for its activations, from the configs alone, so that a request
// that cannot fit (a 100000x100000 image) is refused in milliseconds instead of growing until the kernel
// kills it. The figures are lower bounds: they leave out the weights, allocator slack and LibTorch's
// workspaces, so a request refused here could never have run.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "models/flux/flux_config.h"
#include "models/vae/vae_config.h"

namespace dp::pipeline {

struct MemoryEstimate {
  int64_t image_tokens = 0;          // packed latent tokens per image
  int64_t sequence_length = 0;       // text + image tokens the transformer attends over
  double latents_bytes = 0;          // the packed latents and the copies a step holds (noise, prediction)
  double transformer_bytes = 0;      // one transformer block's working set at that sequence length
  double vae_decode_bytes = 0;       // the decoder's largest activations; 0 when not decoding
  // Unfused LoRA: what the low-rank path adds to a block's working set (its widest projection's delta, the
  // pre-GELU output the fused GEMM epilogue no longer absorbs, and the rank-wide intermediate).
  double unfused_lora_bytes = 0;
  // The larger stage: denoise (latents + transformer) or decode (latents + VAE). Doubles: a
  // 1000000x1000000 request overflows no counter.
  double peak_bytes() const;
};

struct MemoryRequest {
  int64_t batch = 1;  // images in the run (prompts x images per prompt)
  int64_t height = 1024;
  int64_t width = 1024;
  int64_t text_tokens = 512;  // max_sequence_length: T5 tokens in every prompt embedding
  at::ScalarType dtype = at::kBFloat16;
  int64_t unfused_lora_rank = 0;  // the largest adapter rank with --lora-mode unfused; 0: no unfused path
  bool true_cfg = false;          // two noise predictions per step are held until the Euler step
};

// `vae` is null when the run writes latents and never decodes; the latent grid then assumes FLUX's 8 pixels
// per latent pixel.
MemoryEstimate estimate_generate_memory(const MemoryRequest& request, const models::FluxConfig& transformer,
                                        const models::VaeConfig* vae);

struct AvailableMemory {
  uint64_t bytes = 0;
  std::string source;  // how it was measured, for messages: "MemAvailable", "cgroup memory.max", "cudaMemGetInfo"
};

// What new allocations can take now: on CPU the kernel's MemAvailable, lowered to the cgroup's remaining
// allowance when the process runs under a memory limit; on CUDA the device's free memory.
AvailableMemory available_memory(const at::Device& device);

}  // namespace dp::pipeline
