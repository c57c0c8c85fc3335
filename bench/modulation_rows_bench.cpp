// FLUX.1-dev's modulation rows at one step (19 double blocks' two 3072 -> 18432 projections, 38 single blocks'
// 3072 -> 9216; 3.2 billion bf16 weights, random: the arithmetic is the same): cuBLAS through ATen's linear (the
// path before the kernel) against diffpipe's modulation_rows kernel, one row a step, two rows a step, and both at
// once for a whole schedule of --steps rows. Prints milliseconds, the bytes a millisecond moves, and ratios; also
// whether the kernel's rows among `steps` equal the ones it computes alone (they must: modulation_rows.h). Then
// every way the kernel can cut the work (kernels::modulation_rows_shapes) at each row count, beside the one it
// takes. Figures only.
//   modulation_rows_bench [--repeats N] [--steps S]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda_call_timing.h"
#include "models/flux/cuda/modulation_rows.h"
#include "models/flux/flux_fused.h"

namespace {

using dp::models::Linear;

// Mean milliseconds of one call over `repeats`.
double milliseconds_per_call(const std::function<void()>& call, int repeats) {
  return dp::bench::seconds_per_call(call, repeats) * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 20, steps = 28;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--repeats") repeats = std::atoi(argv[i + 1]);
    else if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  c10::InferenceMode guard;
  dp::models::flux::set_modulation_table_override(true);  // the kernel, whatever the default
  const int64_t dim = 3072;
  const auto options = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  std::vector<Linear> layers;
  double weight_bytes = 0;
  for (int b = 0; b < 19 * 2 + 38; ++b) {
    const int64_t width = b < 38 ? 6 * dim : 3 * dim;
    layers.push_back({at::randn({width, dim}, options) * 0.02, at::randn({width}, options), nullptr, {}});
    weight_bytes += static_cast<double>(width * dim * 2);
  }
  const at::Tensor one = at::silu(at::randn({1, dim}, options));
  const at::Tensor two = at::silu(at::randn({2, dim}, options));  // two images, or a prompt and its negative
  const at::Tensor schedule = at::silu(at::randn({steps, dim}, options));
  const auto run = [&](const at::Tensor& act, bool kernel) {
    return [&layers, act, kernel] {
      for (const auto& layer : layers)
        (void)(kernel ? dp::models::flux::modulation_rows(layer, act) : at::linear(act, layer.weight, layer.bias));
    };
  };
  const double cublas_one = milliseconds_per_call(run(one, false), repeats);
  const double kernel_one = milliseconds_per_call(run(one, true), repeats);
  const double cublas_two = milliseconds_per_call(run(two, false), repeats);
  const double kernel_two = milliseconds_per_call(run(two, true), repeats);
  const double cublas_all = milliseconds_per_call(run(schedule, false), repeats);
  const double kernel_all = milliseconds_per_call(run(schedule, true), repeats);
  std::printf("%zu modulation projections, %.2f GB of bf16 weights, on %s\n", layers.size(), weight_bytes / 1e9,
              at::cuda::getCurrentDeviceProperties()->name);
  std::printf("one row a step:  cuBLAS %.3f ms (%.2f TB/s), kernel %.3f ms (%.2f TB/s), kernel/cuBLAS %.3f\n",
              cublas_one, weight_bytes / cublas_one / 1e9, kernel_one, weight_bytes / kernel_one / 1e9,
              kernel_one / cublas_one);
  std::printf("two rows a step: cuBLAS %.3f ms, kernel %.3f ms, kernel/cuBLAS %.3f\n", cublas_two, kernel_two,
              kernel_two / cublas_two);
  std::printf("%d rows at once: cuBLAS %.3f ms, kernel %.3f ms, kernel/cuBLAS %.3f\n", steps, cublas_all, kernel_all,
              kernel_all / cublas_all);
  std::printf("a schedule of %d steps: a row a step with cuBLAS %.1f ms, the kernel once %.2f ms (%.3f ms a step "
              "less)\n",
              steps, steps * cublas_one, kernel_all, (steps * cublas_one - kernel_all) / steps);
  bool same = true;
  for (const auto& layer : layers) {
    const at::Tensor all = dp::models::flux::modulation_rows(layer, schedule);
    same = same && at::equal(all.narrow(0, steps - 1, 1),
                             dp::models::flux::modulation_rows(layer, schedule.narrow(0, steps - 1, 1)));
  }
  std::printf("the kernel's last row among %d equals the row alone in every projection: %s\n", steps,
              same ? "yes" : "NO");

  namespace kernels = dp::models::flux::kernels;
  std::printf("\nthe kernel's shapes (features a warp x rows a block), ms for the 76 projections; * the one taken\n");
  for (const at::Tensor& act : {one, two, schedule}) {
    const int64_t rows = act.size(0);
    const auto taken = kernels::modulation_rows_shape(rows);
    std::printf("%3lld row(s):", static_cast<long long>(rows));
    for (const auto shape : kernels::modulation_rows_shapes()) {
      std::vector<at::Tensor> outs;
      for (const auto& layer : layers) outs.push_back(at::empty({rows, layer.weight.size(0)}, options));
      const auto call = [&] {
        for (size_t i = 0; i < layers.size(); ++i)
          kernels::modulation_rows_shaped(shape, dp::models::gpu::ElementType::BF16, act.data_ptr(),
                                          layers[i].weight.data_ptr(), layers[i].bias.data_ptr(), rows,
                                          layers[i].weight.size(0), dim, outs[i].data_ptr(),
                                          at::cuda::getCurrentCUDAStream());
      };
      const double ms = milliseconds_per_call(call, repeats);
      for (size_t i = 0; i < layers.size(); ++i)
        same = same && at::equal(outs[i], dp::models::flux::modulation_rows(layers[i], act));
      const bool is_taken = taken.features == shape.features && taken.rows_per_block == shape.rows_per_block;
      std::printf("  %dx%d %.3f%s", shape.features, shape.rows_per_block, ms, is_taken ? "*" : "");
    }
    std::printf("\n");
  }
  std::printf("every shape gives the same bits: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}
