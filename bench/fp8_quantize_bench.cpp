// The FP8 row quantiser of --fp8-gemms (models/flux/cuda/fp8_quantize.cu) at the shapes one FLUX.1-dev step at
// 1024x1024 feeds it (4096 image and 512 text tokens; 19 double blocks, 38 single blocks), beside the same
// quantisation as eager ATen ops (abs, amax, divide, cast; GELU and concatenation first where the kernel fuses
// them) and beside the bytes it must move at the device's memory bandwidth (its floor). Prints each shape's time
// per call, its count per step and the step's total for all three, with ratios. Figures only.
//   fp8_quantize_bench [--repeats N] [--text-tokens T] [--image-tokens I]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda_call_timing.h"
#include "models/flux/fp8_gemm.h"

namespace {

using dp::bench::seconds_per_call;
using dp::models::flux::Fp8Rows;
using dp::models::flux::quantize_rows_fp8;

struct Shape {
  std::string name;
  int64_t rows, first_columns, second_columns;  // second_columns 0: one matrix
  bool gelu_first, gelu_second;
  int per_step;
};

// What a kernel must read (bf16) and write (e4m3 and a scale per row).
double bytes_moved(const Shape& s) {
  const double columns = static_cast<double>(s.first_columns + s.second_columns);
  return static_cast<double>(s.rows) * (columns * 2 + columns + 4);
}

Fp8Rows eager_aten(const at::Tensor& first, bool gelu_first, const at::Tensor& second, bool gelu_second) {
  at::Tensor rows = gelu_first ? at::gelu(first, "tanh") : first;
  if (second.defined()) rows = at::cat({rows, gelu_second ? at::gelu(second, "tanh") : second}, 1);
  const at::Tensor scales = rows.abs().amax(1, true).to(at::kFloat).clamp_min(1e-12) / 448.0;
  return {(rows.to(at::kFloat) / scales).to(at::kFloat8_e4m3fn), scales};
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 50;
  int64_t text = 512, image = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--repeats") repeats = std::atoi(argv[i + 1]);
    else if (arg == "--text-tokens") text = std::atoll(argv[i + 1]);
    else if (arg == "--image-tokens") image = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: fp8_quantize_bench [--repeats N] [--text-tokens T] [--image-tokens I]\n");
      return 2;
    }
  }
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "fp8_quantize_bench needs a CUDA device\n");
    return 2;
  }
  c10::InferenceMode guard;
  const int64_t dim = 3072, mlp = 12288;  // FLUX.1-dev's inner and MLP widths
  // Per step: each double block quantises, per stream, its normed rows (q|k|v), its attention output, its
  // normed rows again (the MLP's input) and its GELU'd hidden layer; each single block its normed rows and
  // [attention | gelu(mlp)].
  const std::vector<Shape> shapes = {
      {"double, image: normed / attention out", image, dim, 0, false, false, 19 * 3},
      {"double, image: gelu(hidden)", image, mlp, 0, true, false, 19},
      {"double, text: normed / attention out", text, dim, 0, false, false, 19 * 3},
      {"double, text: gelu(hidden)", text, mlp, 0, true, false, 19},
      {"single: normed", text + image, dim, 0, false, false, 38},
      {"single: [attention | gelu(mlp)]", text + image, dim, mlp, false, true, 38},
  };
  const cudaDeviceProp* device = at::cuda::getCurrentDeviceProperties();
  // Peak DRAM bandwidth: memory clock (kHz) x 2 (double data rate) x bus width in bytes.
  int memory_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, at::cuda::current_device());
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, at::cuda::current_device());
  const double peak_bytes_per_s = 2.0 * memory_khz * 1e3 * (bus_bits / 8.0);
  if (peak_bytes_per_s <= 0) {
    std::fprintf(stderr, "the device reports no memory clock or bus width\n");
    return 2;
  }
  std::printf("%s, memory %.0f GB/s at its peak; %d calls per shape\n\n", device->name, peak_bytes_per_s / 1e9,
              repeats);
  std::printf("%-40s %6s %10s %10s %10s %8s %8s\n", "shape (rows x columns)", "/step", "kernel us", "ATen us",
              "floor us", "GB/s", "x floor");
  double kernel_step = 0, aten_step = 0, floor_step = 0;
  for (const auto& s : shapes) {
    const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
    const at::Tensor first = at::randn({s.rows, s.first_columns}, options) * 3;
    const at::Tensor second =
        s.second_columns > 0 ? at::randn({s.rows, s.second_columns}, options) * 3 : at::Tensor();
    const double kernel = seconds_per_call([&] { quantize_rows_fp8(first, s.gelu_first, second, s.gelu_second); },
                                           repeats);
    const double aten = seconds_per_call([&] { eager_aten(first, s.gelu_first, second, s.gelu_second); }, repeats);
    const double floor = bytes_moved(s) / peak_bytes_per_s;
    kernel_step += kernel * s.per_step;
    aten_step += aten * s.per_step;
    floor_step += floor * s.per_step;
    const std::string label = s.name + " (" + std::to_string(s.rows) + " x " +
                              std::to_string(s.first_columns + s.second_columns) + ")";
    std::printf("%-40s %6d %10.1f %10.1f %10.1f %8.0f %8.2f\n", label.c_str(), s.per_step, kernel * 1e6, aten * 1e6,
                floor * 1e6, bytes_moved(s) / kernel / 1e9, kernel / floor);
  }
  std::printf("\none step: kernel %.2f ms, eager ATen %.2f ms (%.2fx the kernel), the memory floor %.2f ms "
              "(the kernel at %.2fx it)\n",
              kernel_step * 1e3, aten_step * 1e3, aten_step / kernel_step, floor_step * 1e3, kernel_step / floor_step);
  return 0;
}
