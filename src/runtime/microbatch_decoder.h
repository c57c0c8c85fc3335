#pragma once
// The decode phase on the rank that runs the VAE, one finished microbatch at a time. When the VAE fits next to
// this rank's transformer blocks it loads on a thread of its own while the first steps denoise (its load is
// then off the image's critical path; the first decode waits for it if it is not done) and each microbatch is
// decoded as soon as its latents arrive, so images reach the disk while the rest of the batch denoises. When it does not fit,
// the latents are kept on the host and decoded after the blocks are freed (the old "decode at the end"
// order), and the log says so. Either way the run's last microbatch is decoded after the blocks are freed: no
// denoising is left for them to do, and beside them its decode set the device's peak (one 1024x1024 image on an
// H100: 26.67 GB, the blocks' 23.8 GB and the decode's working memory).
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <optional>

#include "models/vae/vae.h"
#include "pipeline/flux_pipeline.h"

namespace dp::runtime {

struct DecodeBudget {
  uint64_t stage_bytes = 0;  // this rank's transformer weights, resident through denoising
  int64_t vae_bytes = 0;     // the VAE's weights at the run dtype
  int64_t cap_bytes = -1;    // this rank's --max-memory entry for the VAE's device; -1: the device's free memory
};

class MicrobatchDecoder {
 public:
  using Deliver = std::function<void(int64_t microbatch, const at::Tensor& images)>;
  MicrobatchDecoder(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                    const pipeline::LatentGrid& grid, int64_t microbatch_size, int64_t microbatches, at::Device device,
                    int rank, Deliver deliver);

  // Before denoising: decides whether the VAE stays loaded through it, logs why, and if so starts loading it in
  // the background. warm_up: on CUDA the background thread then decodes a small latent of zeros, so that the
  // first real decode finds the VAE's kernels loaded (AutoencoderKL::warm_up).
  void prepare(const DecodeBudget& budget, bool warm_up);
  bool resident() const { return resident_; }
  // A microbatch's final latents (b, N_img, C): decoded and delivered now when resident, else kept on the host.
  // The run's last microbatch (the `microbatches`-th accepted) is kept where it is, for finish().
  void accept(int64_t microbatch, const at::Tensor& latents);
  // After denoising, once this rank's blocks are freed: decodes and delivers what was kept, then frees the VAE.
  void finish();
  int64_t accepted() const { return accepted_; }
  at::Device device() const { return device_; }
  double decode_seconds() const { return decode_seconds_; }
  // Seconds of VAE loading that held this rank up: the whole load when it ran in line, only the wait for the
  // background load otherwise.
  double load_seconds() const { return load_seconds_; }
  ~MicrobatchDecoder();  // waits for a background load still running (it is bounded by the load itself)

 private:
  void load();
  void start_loading(bool warm_up);
  void wait_for_vae();
  void decode(int64_t microbatch, const at::Tensor& latents);

  pipeline::FluxPipeline& flux_;
  const pipeline::GenerateRequest& request_;
  const pipeline::LatentGrid& grid_;
  int64_t microbatch_size_;
  int64_t microbatches_;
  at::Device device_;
  int rank_;
  Deliver deliver_;
  bool resident_ = false;
  std::optional<models::AutoencoderKL> vae_;
  std::future<models::AutoencoderKL> loading_;
  std::map<int64_t, at::Tensor> kept_;
  int64_t accepted_ = 0;
  double decode_seconds_ = 0, load_seconds_ = 0;
};

}  // namespace dp::runtime
