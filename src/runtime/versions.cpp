#include "runtime/versions.h"

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <mpi.h>
#include <torch/headeronly/version.h>

#include "core/error.h"
#include "runtime/distributed_generate.h"
#include "runtime/transports.h"

namespace dp::runtime {
namespace {

// MPI_Get_library_version may be called before MPI_Init: the first line of the library's own text.
std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "unknown";
  std::string version(text, static_cast<size_t>(length));
  const auto end = version.find_first_of("\r\n,");
  return end == std::string::npos ? version : version.substr(0, end);
}

// 13000 -> "13.0" (CUDA's major*1000 + minor*10).
std::string cuda_version_text(long code) { return str(code / 1000, ".", code % 1000 / 10); }

std::string libtorch_cuda() {
  const auto& hooks = at::detail::getCUDAHooks();
  if (!hooks.hasCUDART()) return "LibTorch built without CUDA";
  std::string text = "LibTorch's CUDA runtime " + cuda_version_text(hooks.versionCUDART());
#ifdef DIFFPIPE_CUDA_TOOLKIT_VERSION
  text += ", diffpipe's kernels built with CUDA " DIFFPIPE_CUDA_TOOLKIT_VERSION;
#else
  text += ", diffpipe built without its CUDA kernels";
#endif
  return text;
}

}  // namespace

std::string version_report() {
  const int gpus = at::detail::getCUDAHooks().hasCUDA() ? at::detail::getCUDAHooks().getNumGPUs() : 0;
  return str(build_id(), "\n",
             "LibTorch: ", TORCH_VERSION, "\n",
             "CUDA: ", libtorch_cuda(), "\n",
             "GPUs visible: ", gpus, gpus == 0 ? " (--device auto runs on the CPU)" : " (--device auto runs on cuda)", "\n",
             "NCCL: ", nccl_version_text(true), "\n",
             "MPI: ", mpi_library_version(), "\n");
}

}  // namespace dp::runtime
