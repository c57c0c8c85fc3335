#include "runtime/microbatch_decoder.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <iomanip>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "core/trace.h"
#include "core/human_units.h"
#include "models/flux/flux_config.h"
#include "models/vae/vae_config.h"
#include "pipeline/device_stats.h"
#include "pipeline/memory_estimate.h"

namespace dp::runtime {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string megabytes(double bytes) { return str(std::fixed, std::setprecision(1), bytes / 1e6, " MB"); }

}  // namespace

MicrobatchDecoder::MicrobatchDecoder(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                                     const pipeline::LatentGrid& grid, int64_t microbatch_size, int64_t microbatches,
                                     at::Device device, int rank, Deliver deliver)
    : flux_(flux), request_(request), grid_(grid), microbatch_size_(microbatch_size), microbatches_(microbatches),
      device_(device), rank_(rank), deliver_(std::move(deliver)) {}

void MicrobatchDecoder::prepare(const DecodeBudget& budget, bool warm_up) {
  // The activations of one microbatch, the larger of a transformer step and a VAE decode: with the VAE resident
  // both kinds of work alternate on this rank, never at once.
  const auto& folder = flux_.folder();
  const auto flux_config_path = folder.component("transformer").path + "/config.json";
  const auto vae_config_path = folder.component("vae").path + "/config.json";
  const auto flux_config = models::FluxConfig::from_json(read_json_file(flux_config_path), flux_config_path);
  const auto vae_config = models::VaeConfig::from_json(read_json_file(vae_config_path), vae_config_path);
  const pipeline::MemoryRequest activations{microbatch_size_, request_.height, request_.width,
                                            request_.max_sequence_length, request_.dtype};
  const double activation_bytes = pipeline::estimate_generate_memory(activations, flux_config, &vae_config).peak_bytes();
  std::string verdict;
  if (budget.cap_bytes >= 0) {
    const double need = static_cast<double>(budget.stage_bytes) + budget.vae_bytes + activation_bytes;
    resident_ = need <= static_cast<double>(budget.cap_bytes);
    verdict = str("blocks ", megabytes(budget.stage_bytes), " + VAE ", megabytes(budget.vae_bytes),
                  " + activations of a microbatch ", megabytes(activation_bytes), " = ", megabytes(need),
                  resident_ ? " fit " : " exceed ", "the --max-memory budget of ", megabytes(budget.cap_bytes));
  } else {
    // No budget given: what the device has free now that this rank's blocks are loaded.
    const auto available = pipeline::available_memory(device_);
    const double need = budget.vae_bytes + activation_bytes;
    resident_ = need <= static_cast<double>(available.bytes);
    verdict = str("VAE ", megabytes(budget.vae_bytes), " + activations of a microbatch ", megabytes(activation_bytes),
                  resident_ ? " fit " : " exceed ", megabytes(available.bytes), " free (", available.source,
                  ") next to the blocks");
  }
  if (resident_) {
    DP_INFO("rank ", rank_, ": decode: the VAE stays loaded through denoising (", verdict,
            "); it loads in the background while denoising starts, and each microbatch is decoded as it finishes");
    start_loading(warm_up && device_.is_cuda());
  } else {
    DP_WARN("rank ", rank_, ": decode at the end: ", verdict,
            "; finished latents wait on the host and are decoded after the transformer is freed");
  }
}

void MicrobatchDecoder::load() {
  const auto started = std::chrono::steady_clock::now();
  vae_.emplace(flux_.load_vae(request_, grid_, device_));
  pipeline::synchronize(device_);
  load_seconds_ += seconds_since(started);
  DP_INFO("rank ", rank_, ": VAE loaded on ", device_.str(), " in ", human_seconds(seconds_since(started)));
}

void MicrobatchDecoder::start_loading(bool warm_up) {
  loading_ = std::async(std::launch::async, [this, warm_up] {
    c10::InferenceMode guard;  // thread-local, as is the device guard
    c10::OptionalDeviceGuard device_guard(device_);
    trace::Scope span(trace::Track::background_load, "VAE load");  // --trace and NVTX
    const auto started = std::chrono::steady_clock::now();
    auto vae = flux_.load_vae(request_, grid_, device_);
    pipeline::synchronize(device_);
    DP_INFO("rank ", rank_, ": VAE loaded on ", device_.str(), " in the background in ",
            human_seconds(seconds_since(started)));
    if (warm_up) {
      const double seconds = vae.warm_up();
      DP_INFO("rank ", rank_, ": warmed up the VAE's decode in the background in ", human_seconds(seconds));
    }
    return vae;
  });
}

void MicrobatchDecoder::wait_for_vae() {
  if (!loading_.valid()) return;
  const auto started = std::chrono::steady_clock::now();
  vae_.emplace(loading_.get());  // a failed load throws here, on the rank's own thread
  const double waited = seconds_since(started);
  load_seconds_ += waited;
  DP_DEBUG("rank ", rank_, ": the first decode waited ", human_seconds(waited), " for the VAE");
}

MicrobatchDecoder::~MicrobatchDecoder() {
  if (loading_.valid()) loading_.wait();
}

void MicrobatchDecoder::accept(int64_t microbatch, const at::Tensor& latents) {
  ++accepted_;
  if (resident_ && accepted_ == microbatches_) {
    // Left on its device: finish() runs once the blocks are freed, so the decode's activations take their place.
    kept_[microbatch] = latents;
    DP_INFO("rank ", rank_, ": microbatch ", microbatch, ", the last, is decoded once this rank's transformer blocks "
            "are freed (beside them its decode would set the device's peak)");
    return;
  }
  if (resident_) {
    decode(microbatch, latents);
    return;
  }
  kept_[microbatch] = latents.to(at::kCPU);
}

void MicrobatchDecoder::decode(int64_t microbatch, const at::Tensor& latents) {
  c10::InferenceMode guard;
  wait_for_vae();
  const auto started = std::chrono::steady_clock::now();
  trace::Scope span(trace::Track::host, str("decode mb ", microbatch));  // --trace and NVTX
  const at::Tensor images = pipeline::FluxPipeline::decode_with(*vae_, grid_, latents);
  decode_seconds_ += seconds_since(started);
  deliver_(microbatch, images);
}

void MicrobatchDecoder::finish() {
  wait_for_vae();
  if (!kept_.empty()) {
    if (!vae_) load();
    for (auto& [microbatch, latents] : kept_) {
      decode(microbatch, latents);
      latents = at::Tensor();
    }
    kept_.clear();
  }
  vae_.reset();
}

}  // namespace dp::runtime
