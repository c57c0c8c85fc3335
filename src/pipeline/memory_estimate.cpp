#include "pipeline/memory_estimate.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <fstream>
#include <string>

#include "core/error.h"

namespace dp::pipeline {
namespace {

// Live tensors of one transformer block, in units of (tokens x inner_dim), at the block's peak: the
// residual stream (1), q, k and v (3), the attention output (1), the MLP's 4x projection and GELU's output
// of the same size (8). Fewer than the block ever holds: the estimate must stay a lower bound.
constexpr double kBlockActivationWidths = 13;
// Copies of the packed latents a step holds: the latents, the noise prediction, the stepped result and
// the initial noise before packing.
constexpr double kLatentCopies = 4;
// Tensors of the decoder's largest size alive together: a resnet's input, its normalised copy and the
// convolution's output (or an upsampler's input and output).
constexpr double kDecoderLiveTensors = 3;

// The largest activation of the VAE decoder, in elements per image: conv_in and the mid block at latent
// size, then each up block at its input's channels and size, upsampling (x2 per side) after every block
// but the last, as diffusers' Decoder does.
double largest_decoder_activation(const models::VaeConfig& vae, double latent_pixels) {
  std::vector<int64_t> channels(vae.block_out_channels.rbegin(), vae.block_out_channels.rend());
  double pixels = latent_pixels;
  double current = static_cast<double>(channels.front());
  double largest = current * pixels;
  for (size_t i = 0; i < channels.size(); ++i) {
    const double out = static_cast<double>(channels[i]);
    largest = std::max(largest, std::max(current, out) * pixels);
    current = out;
    if (i + 1 < channels.size()) {
      pixels *= 4;
      largest = std::max(largest, current * pixels);
    }
  }
  return largest;
}

// A "Key:   1234 kB" line of a /proc file, in bytes; -1 when absent.
int64_t proc_kilobytes(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    try {
      return static_cast<int64_t>(std::stoull(line.substr(key.size() + 1))) * 1024;
    } catch (const std::exception&) {
      return -1;
    }
  }
  return -1;
}

// One integer in a cgroup file (memory.max, memory.current); -1 for "max", absent or unreadable.
int64_t cgroup_value(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return static_cast<int64_t>(std::stoull(text));
  } catch (const std::exception&) {
    return -1;
  }
}

// This process's cgroup v2 folder under /sys/fs/cgroup ("0::/user.slice/job-42" in /proc/self/cgroup);
// empty (the root, which has no limit files) when there is none.
std::string own_cgroup_v2_path() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3) == "/" ? std::string() : line.substr(3);
  }
  return {};
}

}  // namespace

double MemoryEstimate::peak_bytes() const {
  return latents_bytes + std::max(transformer_bytes + unfused_lora_bytes, vae_decode_bytes);
}

MemoryEstimate estimate_generate_memory(const MemoryRequest& request, const models::FluxConfig& transformer,
                                        const models::VaeConfig* vae) {
  const double element = static_cast<double>(c10::elementSize(request.dtype));
  const double batch = static_cast<double>(request.batch);
  const int64_t scale = vae != nullptr ? vae->spatial_scale() : 8;
  const int64_t latent_height = request.height / scale, latent_width = request.width / scale;

  MemoryEstimate out;
  out.image_tokens = (latent_height / 2) * (latent_width / 2);
  out.sequence_length = out.image_tokens + request.text_tokens;
  const double tokens = static_cast<double>(out.image_tokens);
  const double latent_copies = kLatentCopies + (request.true_cfg ? 2 : 0);
  out.latents_bytes = latent_copies * batch * tokens * static_cast<double>(transformer.in_channels) * element;
  out.transformer_bytes = kBlockActivationWidths * batch * static_cast<double>(out.sequence_length) *
                          static_cast<double>(transformer.inner_dim()) * element;
  if (request.unfused_lora_rank > 0) {
    out.unfused_lora_bytes = batch * static_cast<double>(out.sequence_length) *
                             (2 * static_cast<double>(transformer.mlp_hidden_dim()) +
                              static_cast<double>(request.unfused_lora_rank)) *
                             element;
  }
  if (vae != nullptr) {
    const double latent_pixels = static_cast<double>(latent_height) * static_cast<double>(latent_width);
    const double image_pixels = static_cast<double>(request.height) * static_cast<double>(request.width);
    // Plus the postprocess: the image in float32, then permuted to (H, W, 3).
    out.vae_decode_bytes = kDecoderLiveTensors * batch * largest_decoder_activation(*vae, latent_pixels) * element +
                           2 * batch * 3 * image_pixels * 4;
  }
  return out;
}

AvailableMemory available_memory(const at::Device& device) {
  if (device.is_cuda()) {
#ifdef DIFFPIPE_HAVE_CUDA
    const c10::cuda::CUDAGuard guard(device.has_index() ? device.index() : c10::DeviceIndex(0));
    size_t free_bytes = 0, total_bytes = 0;
    const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
    DP_CHECK(status == cudaSuccess, "cannot read the free memory of ", device.str(), " (",
             cudaGetErrorString(status), ")");
    return {static_cast<uint64_t>(free_bytes), "free on " + device.str()};
#else
    DP_FAIL("this build has no CUDA support");
#endif
  }
  AvailableMemory out;
  const int64_t available = proc_kilobytes("/proc/meminfo", "MemAvailable");
  DP_CHECK(available >= 0, "/proc/meminfo has no MemAvailable line: cannot tell how much memory is free");
  out = {static_cast<uint64_t>(available), "MemAvailable"};
  // Under a cgroup v2 memory limit (containers, SLURM jobs) the limit binds before the host runs out.
  const std::string cgroup = "/sys/fs/cgroup" + own_cgroup_v2_path();
  const int64_t limit = cgroup_value(cgroup + "/memory.max");
  const int64_t used = cgroup_value(cgroup + "/memory.current");
  if (limit >= 0 && used >= 0) {
    const uint64_t allowance = static_cast<uint64_t>(std::max<int64_t>(limit - used, 0));
    if (allowance < out.bytes) out = {allowance, "cgroup memory.max - memory.current"};
  }
  return out;
}

}  // namespace dp::pipeline
