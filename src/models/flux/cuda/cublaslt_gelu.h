#pragma once
// One cuBLASLt matmul with the bias + GELU epilogue, for the FLUX MLP up-projections: the GELU runs on the
// fp32 accumulator inside the GEMM, so the pre-activation never goes through memory.
#include <ATen/ATen.h>

namespace dp::models::cublaslt {

// out = gelu(x @ weight^T + bias, tanh approximation) for x (M, K), weight (N, K) and bias (N) contiguous,
// and out (M, N) with contiguous rows and any row stride (a column range of a wider buffer). All four share
// one dtype (fp32, fp16 or bf16) and one CUDA device; accumulation is fp32 (no TF32), as in ATen's linear.
// Runs on the current stream and returns false, having done nothing, when cuBLASLt has no algorithm for the
// problem (or in a build without CUDA), so that the caller can take the ATen path.
bool linear_bias_gelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& out);

}  // namespace dp::models::cublaslt
