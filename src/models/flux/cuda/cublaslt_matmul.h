#pragma once
// cuBLASLt matmuls of the nn.Linear shape with a fused epilogue, through the cuBLASLt that LibTorch loaded:
// out = epilogue(x @ weight^T + bias). The algorithm is cuBLASLt's heuristic's first choice unless the caller
// picks another of its candidates (bench/gemm_algorithms_bench.cpp times them at FLUX's shapes).
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#ifdef DIFFPIPE_HAVE_CUDA
#include <cublasLt.h>
#endif

namespace dp::models::cublaslt {

enum class Epilogue { kBias, kGeluBias };

// x (M, K), weight (N, K) and bias (N) contiguous; out (M, N) with contiguous rows and any row stride (a column
// range of a wider buffer). One dtype (fp32, fp16 or bf16) and one CUDA device for all four; fp32 accumulation,
// no TF32, as in ATen's linear. The constructor checks the operands and throws, naming their shapes.
struct LinearProblem {
  LinearProblem(at::Tensor x, at::Tensor weight, at::Tensor bias, at::Tensor out, Epilogue epilogue);
  at::Tensor x, weight, bias, out;
  Epilogue epilogue;
};

#ifdef DIFFPIPE_HAVE_CUDA
// Up to `count` algorithms cuBLASLt's heuristic offers for the problem, best first by its own estimate; empty
// when it offers none (or when LibTorch loaded no cuBLASLt).
std::vector<cublasLtMatmulAlgo_t> candidate_algorithms(const LinearProblem& problem, int count);
// Runs the problem with `algorithm` (one of its candidates) on the current stream.
void run(const LinearProblem& problem, const cublasLtMatmulAlgo_t& algorithm);
#endif

// Runs the problem with the heuristic's first choice; false, having done nothing, when cuBLASLt offers no
// algorithm for it (or in a build without CUDA), so that the caller can take the ATen path.
bool run_with_heuristic(const LinearProblem& problem);

}  // namespace dp::models::cublaslt
