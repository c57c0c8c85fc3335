#include "models/flux/cuda/cublaslt_matmul.h"

#include <utility>

#include "core/error.h"

namespace dp::models::cublaslt {

LinearProblem::LinearProblem(at::Tensor x_, at::Tensor weight_, at::Tensor bias_, at::Tensor out_, Epilogue epilogue_)
    : x(std::move(x_)), weight(std::move(weight_)), bias(std::move(bias_)), out(std::move(out_)), epilogue(epilogue_) {
  DP_CHECK(x.dim() == 2 && weight.dim() == 2 && bias.dim() == 1 && out.dim() == 2, "cuBLASLt linear: x ", x.sizes(),
           ", weight ", weight.sizes(), ", bias ", bias.sizes(), ", out ", out.sizes());
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  DP_CHECK(weight.size(1) == k && bias.size(0) == n && out.size(0) == m && out.size(1) == n, "cuBLASLt linear: x ",
           x.sizes(), " times weight ", weight.sizes(), "^T plus bias ", bias.sizes(), " does not give out ",
           out.sizes());
  DP_CHECK(x.stride(1) == 1 && x.stride(0) >= k && weight.is_contiguous() && bias.is_contiguous() &&
               out.stride(1) == 1 && out.stride(0) >= n,
           "cuBLASLt linear: operands need contiguous rows (x strides ", x.strides(), ", out strides ", out.strides(),
           ")");
  const at::ScalarType type = x.scalar_type();
  DP_CHECK(weight.scalar_type() == type && bias.scalar_type() == type && out.scalar_type() == type,
           "cuBLASLt linear: dtypes differ (x ", type, ", weight ", weight.scalar_type(), ", bias ",
           bias.scalar_type(), ", out ", out.scalar_type(), ")");
  DP_CHECK(x.is_cuda() && weight.device() == x.device() && bias.device() == x.device() && out.device() == x.device(),
           "cuBLASLt linear: operands on different devices or not on CUDA");
}

}  // namespace dp::models::cublaslt

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cublas_api.h>
#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdint>
#include <string>

namespace dp::models::cublaslt {
namespace {

// LibTorch loads its own cuBLASLt (the pip wheel's, which can be newer than the system toolkit's, and which
// its cuBLAS must be paired with). Binding to that loaded copy at run time, instead of linking one, keeps a
// single cuBLASLt in the process whatever the library search paths say.
struct CublasLt {
  decltype(&cublasLtGetStatusString) status_string = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  bool complete = false;
};

template <typename F>
void bind(void* library, const char* name, F& function, bool& complete) {
  function = reinterpret_cast<F>(dlsym(library, name));
  complete = complete && function != nullptr;
}

const CublasLt& cublaslt() {
  static const CublasLt api = [] {
    CublasLt a;
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* library = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD);  // only the copy already in the process
    if (library == nullptr) return a;
    a.complete = true;
    bind(library, "cublasLtGetStatusString", a.status_string, a.complete);
    bind(library, "cublasLtMatmulDescCreate", a.desc_create, a.complete);
    bind(library, "cublasLtMatmulDescDestroy", a.desc_destroy, a.complete);
    bind(library, "cublasLtMatmulDescSetAttribute", a.desc_set, a.complete);
    bind(library, "cublasLtMatrixLayoutCreate", a.layout_create, a.complete);
    bind(library, "cublasLtMatrixLayoutDestroy", a.layout_destroy, a.complete);
    bind(library, "cublasLtMatmulPreferenceCreate", a.preference_create, a.complete);
    bind(library, "cublasLtMatmulPreferenceDestroy", a.preference_destroy, a.complete);
    bind(library, "cublasLtMatmulPreferenceSetAttribute", a.preference_set, a.complete);
    bind(library, "cublasLtMatmulAlgoGetHeuristic", a.heuristic, a.complete);
    bind(library, "cublasLtMatmul", a.matmul, a.complete);
    return a;
  }();
  return api;
}

void check(cublasStatus_t status, const char* call) {
  DP_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", call, " failed: ", cublaslt().status_string(status));
}

cudaDataType_t data_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return CUDA_R_32F;
    case at::kHalf: return CUDA_R_16F;
    case at::kBFloat16: return CUDA_R_16BF;
    default: DP_FAIL("cuBLASLt matmul: unsupported dtype ", type);
  }
}

// The largest power of two up to 256 that divides the address: the heuristic only offers kernels whose
// vector loads the operands' alignment allows.
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// cuBLASLt descriptors are C handles: these own one each for the length of a call.
struct OperationDesc {
  cublasLtMatmulDesc_t handle = nullptr;
  OperationDesc() { check(cublaslt().desc_create(&handle, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate"); }
  ~OperationDesc() { cublaslt().desc_destroy(handle); }
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value) {
    check(cublaslt().desc_set(handle, attribute, &value, sizeof(value)), "MatmulDescSetAttribute");
  }
};

struct Layout {
  cublasLtMatrixLayout_t handle = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t columns, int64_t leading) {
    check(cublaslt().layout_create(&handle, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(columns),
                                     leading),
          "MatrixLayoutCreate");
  }
  ~Layout() { cublaslt().layout_destroy(handle); }
};

struct Preference {
  cublasLtMatmulPreference_t handle = nullptr;
  Preference() { check(cublaslt().preference_create(&handle), "MatmulPreferenceCreate"); }
  ~Preference() { cublaslt().preference_destroy(handle); }
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
    check(cublaslt().preference_set(handle, attribute, &value, sizeof(value)), "PreferenceSetAttribute");
  }
};

// The descriptors of one problem, shared by the heuristic's query and the matmul (microseconds to build, against a
// GEMM of a millisecond).
struct Descriptors {
  explicit Descriptors(const LinearProblem& p)
      : a(data_type(p.x.scalar_type()), p.x.size(1), p.weight.size(0), p.weight.stride(0)),
        b(data_type(p.x.scalar_type()), p.x.size(1), p.x.size(0), p.x.stride(0)),
        d(data_type(p.x.scalar_type()), p.weight.size(0), p.x.size(0), p.out.stride(0)) {
    // Row-major (M, N) is column-major (N, M): compute out^T = op(W) * x^T with W read transposed, so the bias
    // runs along D's rows, which is what the epilogue broadcasts it over.
    operation.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    operation.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    operation.set(CUBLASLT_MATMUL_DESC_EPILOGUE,
                  p.epilogue == Epilogue::kGeluBias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS);
    operation.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias.const_data_ptr());
  }
  OperationDesc operation;
  Layout a, b, d;
};

// The heuristic's first `count` choices for the problem `desc` describes.
std::vector<cublasLtMatmulAlgo_t> query_heuristic(const LinearProblem& p, const Descriptors& desc, int count) {
  Preference preference;
  preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, at::cuda::getCUDABlasLtWorkspaceSize());
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(p.weight.const_data_ptr()));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(p.x.const_data_ptr()));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(p.out.const_data_ptr()));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(p.out.const_data_ptr()));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int found = 0;
  const cublasStatus_t status =
      cublaslt().heuristic(at::cuda::getCurrentCUDABlasLtHandle(), desc.operation.handle, desc.a.handle, desc.b.handle,
                           desc.d.handle, desc.d.handle, preference.handle, count, results.data(), &found);
  std::vector<cublasLtMatmulAlgo_t> algorithms;
  if (status != CUBLAS_STATUS_SUCCESS) return algorithms;
  for (int i = 0; i < found; ++i)
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
      algorithms.push_back(results[static_cast<size_t>(i)].algo);
  return algorithms;
}

void matmul(const LinearProblem& p, const Descriptors& desc, const cublasLtMatmulAlgo_t& algorithm) {
  const float alpha = 1.0F, beta = 0.0F;
  check(cublaslt().matmul(at::cuda::getCurrentCUDABlasLtHandle(), desc.operation.handle, &alpha,
                          p.weight.const_data_ptr(), desc.a.handle, p.x.const_data_ptr(), desc.b.handle, &beta,
                          p.out.data_ptr(), desc.d.handle, p.out.data_ptr(), desc.d.handle, &algorithm,
                          at::cuda::getCUDABlasLtWorkspace(), at::cuda::getCUDABlasLtWorkspaceSize(),
                          at::cuda::getCurrentCUDAStream()),
        "Matmul");
}

}  // namespace

std::vector<cublasLtMatmulAlgo_t> candidate_algorithms(const LinearProblem& p, int count) {
  if (!cublaslt().complete || count <= 0) return {};
  return query_heuristic(p, Descriptors(p), count);
}

void run(const LinearProblem& p, const cublasLtMatmulAlgo_t& algorithm) {
  DP_CHECK(cublaslt().complete, "cuBLASLt matmul: LibTorch has not loaded cuBLASLt");
  matmul(p, Descriptors(p), algorithm);
}

bool run_with_heuristic(const LinearProblem& p) {
  if (p.x.size(0) == 0 || p.weight.size(0) == 0) return true;
  if (!cublaslt().complete) return false;
  const Descriptors desc(p);  // one set for the query and the matmul: this runs on every GELU projection
  const std::vector<cublasLtMatmulAlgo_t> first = query_heuristic(p, desc, 1);
  if (first.empty()) return false;
  matmul(p, desc, first.front());
  return true;
}

}  // namespace dp::models::cublaslt

#else

namespace dp::models::cublaslt {
bool run_with_heuristic(const LinearProblem&) { return false; }
}  // namespace dp::models::cublaslt

#endif
