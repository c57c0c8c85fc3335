// FLUX's VAE decode at full size on the GPU, diffpipe's group norm kernel (models/vae/cuda/group_norm_kernels.cu)
// against ATen's group_norm, side by side in one process: the median decode of --repeats after two warm-up ones,
// the ratio, and how far apart the two images are. bench/vae_decode.py gives diffusers' decode and its kernel
// families on the same machine. Figures only.
//   vae_decode_bench --vae DIR [--height 1024] [--width 1024] [--repeats 10] [--dtype bf16|fp16|fp32]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "models/flux/flux_fused.h"
#include "models/vae/vae.h"

namespace {

double median_ms(const dp::models::AutoencoderKL& vae, const at::Tensor& z, int repeats, at::Tensor* image) {
  std::vector<double> times;
  for (int i = 0; i < repeats + 2; ++i) {
    at::cuda::getCurrentCUDAStream().synchronize();
    const auto started = std::chrono::steady_clock::now();
    *image = vae.decode(z);
    at::cuda::getCurrentCUDAStream().synchronize();
    if (i >= 2) times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string folder, dtype_name = "bf16";
  int64_t height = 1024, width = 1024;
  int repeats = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--vae") folder = value;
    else if (flag == "--height") height = std::atoll(value.c_str());
    else if (flag == "--width") width = std::atoll(value.c_str());
    else if (flag == "--repeats") repeats = std::max(1, std::atoi(value.c_str()));
    else if (flag == "--dtype") dtype_name = value;
    else {
      std::fprintf(stderr, "vae_decode_bench: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  if (folder.empty() || !at::cuda::is_available()) {
    std::fprintf(stderr, "usage: vae_decode_bench --vae DIR [--height H] [--width W] [--repeats N] [--dtype bf16] "
                         "(needs a GPU)\n");
    return 2;
  }
  const at::ScalarType dtype = dtype_name == "fp32" ? at::kFloat : dtype_name == "fp16" ? at::kHalf : at::kBFloat16;
  c10::InferenceMode guard;
  const auto vae = dp::models::AutoencoderKL::load(folder, dtype, at::Device(at::kCUDA, 0));
  const int64_t scale = vae.config().spatial_scale();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  const at::Tensor z = at::randn({1, vae.config().latent_channels, height / scale, width / scale}, generator)
                           .to(at::kCUDA, dtype);
  at::Tensor with_kernel, with_aten;
  dp::models::flux::set_fused_kernels_enabled(true);
  const double kernel_ms = median_ms(vae, z, repeats, &with_kernel);
  dp::models::flux::set_fused_kernels_enabled(false);
  const double aten_ms = median_ms(vae, z, repeats, &with_aten);
  dp::models::flux::set_fused_kernels_enabled(true);
  const double difference = (with_kernel.to(at::kFloat) - with_aten.to(at::kFloat)).abs().max().item<double>();
  const double differing = ((with_kernel != with_aten).to(at::kDouble)).mean().item<double>();
  std::printf("VAE decode %lldx%lld, %s, median of %d (%s):\n", static_cast<long long>(width),
              static_cast<long long>(height), dtype_name.c_str(), repeats,
              at::cuda::getCurrentDeviceProperties()->name);
  std::printf("  ATen group_norm            %8.2f ms  1.000x\n", aten_ms);
  std::printf("  diffpipe group norm kernel %8.2f ms  %5.3fx\n", kernel_ms, kernel_ms / aten_ms);
  std::printf("  images: largest difference %.4f (values in about [-1, 1]), %.2f%% of values differ\n", difference,
              100 * differing);
  return 0;
}
