// Does cuBLASLt's heuristic leave time on the table at FLUX.1-dev's GEMM shapes? For each projection one
// 1024x1024 step runs (4096 image and 512 text tokens; 19 double blocks, 38 single blocks), times every algorithm
// the heuristic offers (up to --candidates) with the epilogue the model uses (bias, or bias + GELU), beside
// ATen's linear for the bias shapes. Candidates are timed in interleaved rounds after the GPU has run at full load
// for --heat-seconds, so that all of them see the loop's power-limited clock rather than a cool GPU's boost.
// Prints each shape's time per call with the heuristic's first choice and with the fastest candidate, and one
// step's GEMM total both ways. Figures only.
//   gemm_algorithms_bench [--candidates N] [--rounds R] [--calls C] [--heat-seconds S]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "models/flux/cuda/cublaslt_matmul.h"

namespace {

using dp::models::cublaslt::Epilogue;
using dp::models::cublaslt::LinearProblem;

struct Shape {
  std::string name;
  int64_t rows, in, out;
  int64_t out_stride;  // the output's row stride: proj_mlp writes a column range of [attention | mlp]
  Epilogue epilogue;
  int per_step;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Milliseconds per call of each candidate, median over interleaved rounds of `calls` back-to-back launches.
std::vector<double> time_candidates(const LinearProblem& problem, const std::vector<cublasLtMatmulAlgo_t>& candidates,
                                    int rounds, int calls) {
  std::vector<std::vector<double>> per_round(candidates.size());
  for (const auto& algorithm : candidates) dp::models::cublaslt::run(problem, algorithm);  // first use
  for (int r = 0; r < rounds; ++r) {
    for (size_t c = 0; c < candidates.size(); ++c) {
      at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
      start.record();
      for (int i = 0; i < calls; ++i) dp::models::cublaslt::run(problem, candidates[c]);
      stop.record();
      stop.synchronize();
      per_round[c].push_back(start.elapsed_time(stop) / calls);
    }
  }
  std::vector<double> ms;
  for (auto& times : per_round) ms.push_back(median(times));
  return ms;
}

double time_aten(const LinearProblem& p, int rounds, int calls) {
  std::vector<double> times;
  at::linear(p.x, p.weight, p.bias);
  for (int r = 0; r < rounds; ++r) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    for (int i = 0; i < calls; ++i) at::linear(p.x, p.weight, p.bias);
    stop.record();
    stop.synchronize();
    times.push_back(start.elapsed_time(stop) / calls);
  }
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  int candidates_wanted = 16, rounds = 15, calls = 5;
  double heat_seconds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--candidates") candidates_wanted = std::atoi(argv[i + 1]);
    else if (arg == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (arg == "--calls") calls = std::atoi(argv[i + 1]);
    else if (arg == "--heat-seconds") heat_seconds = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: gemm_algorithms_bench [--candidates N] [--rounds R] [--calls C] "
                           "[--heat-seconds S]\n");
      return 2;
    }
  }
  if (!at::hasCUDA() || candidates_wanted < 1 || rounds < 1 || calls < 1) {
    std::fprintf(stderr, "gemm_algorithms_bench needs a CUDA device and positive counts\n");
    return 2;
  }
  c10::InferenceMode guard;
  const int64_t dim = 3072, mlp = 12288, text = 512, image = 4096, joint = text + image;  // FLUX.1-dev
  const std::vector<Shape> shapes = {
      {"double image q|k|v", image, dim, 3 * dim, 3 * dim, Epilogue::kBias, 19},
      {"double image to_out", image, dim, dim, dim, Epilogue::kBias, 19},
      {"double image ff in (gelu)", image, dim, mlp, mlp, Epilogue::kGeluBias, 19},
      {"double image ff out", image, mlp, dim, dim, Epilogue::kBias, 19},
      {"double text q|k|v", text, dim, 3 * dim, 3 * dim, Epilogue::kBias, 19},
      {"double text to_add_out", text, dim, dim, dim, Epilogue::kBias, 19},
      {"double text ff in (gelu)", text, dim, mlp, mlp, Epilogue::kGeluBias, 19},
      {"double text ff out", text, mlp, dim, dim, Epilogue::kBias, 19},
      {"single q|k|v", joint, dim, 3 * dim, 3 * dim, Epilogue::kBias, 38},
      {"single proj_mlp (gelu)", joint, dim, mlp, dim + mlp, Epilogue::kGeluBias, 38},
      {"single proj_out", joint, dim + mlp, dim, dim, Epilogue::kBias, 38},
      {"double modulation rows", 1, dim, 6 * dim, 6 * dim, Epilogue::kBias, 38},
      {"single modulation rows", 1, dim, 3 * dim, 3 * dim, Epilogue::kBias, 38},
  };
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  auto problem_of = [&](const Shape& s) {
    const at::Tensor out = at::empty({s.rows, s.out_stride}, options).narrow(1, s.out_stride - s.out, s.out);
    return LinearProblem(at::randn({s.rows, s.in}, options), at::randn({s.out, s.in}, options) * 0.02,
                         at::randn({s.out}, options), out, s.epilogue);
  };

  // Bring the GPU to the loop's state: its power limit, not a cool GPU's boost clock.
  {
    const LinearProblem heat = problem_of(shapes[2]);
    const auto first = dp::models::cublaslt::candidate_algorithms(heat, 1);
    if (first.empty()) {
      std::fprintf(stderr, "cuBLASLt offers no algorithm for bf16 at FLUX's MLP shape\n");
      return 1;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(heat_seconds);
    while (std::chrono::steady_clock::now() < until) {
      for (int i = 0; i < 50; ++i) dp::models::cublaslt::run(heat, first.front());
      at::cuda::getCurrentCUDAStream().synchronize();
    }
  }

  std::printf("%s; up to %d candidates per shape, median of %d rounds of %d calls\n\n",
              at::cuda::getCurrentDeviceProperties()->name, candidates_wanted, rounds, calls);
  std::printf("%-28s %5s %5s %5s %5s %4s %10s %10s %6s %9s %10s %9s\n", "shape", "M", "K", "N", "/step", "cand",
              "first us", "best us", "which", "best/1st", "ATen us", "max diff");
  double first_step = 0, best_step = 0;
  for (const auto& s : shapes) {
    const LinearProblem problem = problem_of(s);
    const auto candidates = dp::models::cublaslt::candidate_algorithms(problem, candidates_wanted);
    if (candidates.empty()) {
      std::printf("%-28s no algorithm offered\n", s.name.c_str());
      continue;
    }
    const std::vector<double> ms = time_candidates(problem, candidates, rounds, calls);
    const size_t best = static_cast<size_t>(std::min_element(ms.begin(), ms.end()) - ms.begin());
    // The candidates differ in summation order only: their outputs should agree to bf16 rounding.
    dp::models::cublaslt::run(problem, candidates.front());
    const at::Tensor reference = problem.out.to(at::kFloat);
    dp::models::cublaslt::run(problem, candidates[best]);
    const double diff = (problem.out.to(at::kFloat) - reference).abs().max().item<double>();
    const double aten = s.epilogue == Epilogue::kBias ? time_aten(problem, rounds, calls) : 0.0;
    first_step += ms.front() * s.per_step;
    best_step += ms[best] * s.per_step;
    std::printf("%-28s %5lld %5lld %5lld %5d %4zu %10.1f %10.1f %6zu %9.3f %10s %9.4f\n", s.name.c_str(),
                static_cast<long long>(s.rows), static_cast<long long>(s.in), static_cast<long long>(s.out),
                s.per_step, candidates.size(), ms.front() * 1e3, ms[best] * 1e3, best, ms[best] / ms.front(),
                aten > 0 ? std::to_string(static_cast<int>(aten * 1e3 + 0.5)).c_str() : "-", diff);
  }
  std::printf("\none step's GEMMs: heuristic's first choice %.2f ms, fastest candidates %.2f ms (%.3fx)\n", first_step,
              best_step, best_step / first_step);
  return 0;
}
