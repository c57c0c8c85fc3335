#include "models/flux/cuda/cublaslt_gelu.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cublas_api.h>
#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdint>
#include <string>

#include "core/error.h"

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
    default: DP_FAIL("cuBLASLt GELU epilogue: unsupported dtype ", type);
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

}  // namespace

bool linear_bias_gelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& out) {
  DP_CHECK(x.dim() == 2 && weight.dim() == 2 && bias.dim() == 1 && out.dim() == 2, "linear_bias_gelu: x ",
           x.sizes(), ", weight ", weight.sizes(), ", bias ", bias.sizes(), ", out ", out.sizes());
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  DP_CHECK(weight.size(1) == k && bias.size(0) == n && out.size(0) == m && out.size(1) == n,
           "linear_bias_gelu: x ", x.sizes(), " times weight ", weight.sizes(), "^T plus bias ", bias.sizes(),
           " does not give out ", out.sizes());
  DP_CHECK(x.stride(1) == 1 && x.stride(0) >= k && weight.is_contiguous() && bias.is_contiguous() &&
               out.stride(1) == 1 && out.stride(0) >= n,
           "linear_bias_gelu: operands need contiguous rows (x strides ", x.strides(), ", out strides ", out.strides(),
           ")");
  const at::ScalarType type = x.scalar_type();
  DP_CHECK(weight.scalar_type() == type && bias.scalar_type() == type && out.scalar_type() == type,
           "linear_bias_gelu: dtypes differ (x ", type, ", weight ", weight.scalar_type(), ", bias ",
           bias.scalar_type(), ", out ", out.scalar_type(), ")");
  DP_CHECK(x.is_cuda() && weight.device() == x.device() && bias.device() == x.device() && out.device() == x.device(),
           "linear_bias_gelu: operands on different devices");
  if (!cublaslt().complete) return false;
  if (m == 0 || n == 0) return true;

  // Row-major (M, N) is column-major (N, M): compute out^T = op(W) * x^T with W read transposed, so the bias
  // runs along D's rows, which is what the epilogue broadcasts it over.
  OperationDesc operation;
  operation.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  operation.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  operation.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_BIAS);
  operation.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.const_data_ptr());
  const cudaDataType_t element = data_type(type);
  const Layout a(element, k, n, weight.stride(0)), b(element, k, m, x.stride(0)), d(element, n, m, out.stride(0));

  const size_t workspace_bytes = at::cuda::getCUDABlasLtWorkspaceSize();
  Preference preference;
  preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(weight.const_data_ptr()));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(x.const_data_ptr()));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(out.const_data_ptr()));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(out.const_data_ptr()));

  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t choice{};
  int found = 0;
  const cublasStatus_t status = cublaslt().heuristic(handle, operation.handle, a.handle, b.handle,
                                                               d.handle, d.handle, preference.handle, 1, &choice, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  const float alpha = 1.0F, beta = 0.0F;
  check(cublaslt().matmul(handle, operation.handle, &alpha, weight.const_data_ptr(), a.handle, x.const_data_ptr(),
                       b.handle, &beta, out.data_ptr(), d.handle, out.data_ptr(), d.handle, &choice.algo,
                       at::cuda::getCUDABlasLtWorkspace(), workspace_bytes, at::cuda::getCurrentCUDAStream()),
        "Matmul");
  return true;
}

}  // namespace dp::models::cublaslt

#else

namespace dp::models::cublaslt {
bool linear_bias_gelu(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) { return false; }
}  // namespace dp::models::cublaslt

#endif
