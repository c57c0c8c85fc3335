#include "pipeline/device_stats.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <ATen/cuda/CUDAContext.h>
#endif
#include <ATen/Parallel.h>

#include "core/error.h"
#include "core/memory_stats.h"

namespace dp::pipeline {

#ifdef DIFFPIPE_HAVE_CUDA
namespace {
// The caching allocator sizes its per-device tables when CUDA is first used, so a stage timer that starts
// before the stage's first allocation would ask about a device the allocator does not know yet.
c10::DeviceIndex initialised_cuda_index(const at::Device& device) {
  at::globalContext().lazyInitDevice(at::kCUDA);
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
}  // namespace
#endif

std::string device_name(const at::Device& device) {
  if (!device.is_cuda()) return str("cpu (", at::get_num_threads(), " threads)");
#ifdef DIFFPIPE_HAVE_CUDA
  return at::cuda::getDeviceProperties(initialised_cuda_index(device))->name;
#else
  DP_FAIL("this build has no CUDA support");
#endif
}

void synchronize(const at::Device& device) {
  if (!device.is_cuda()) return;
#ifdef DIFFPIPE_HAVE_CUDA
  c10::cuda::device_synchronize();
#else
  DP_FAIL("this build has no CUDA support");
#endif
}

uint64_t peak_memory_bytes(const at::Device& device) {
  if (device.is_cuda()) {
#ifdef DIFFPIPE_HAVE_CUDA
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(initialised_cuda_index(device));
    return static_cast<uint64_t>(stats.allocated_bytes[0].peak);
#else
    DP_FAIL("this build has no CUDA support");
#endif
  }
  return peak_resident_bytes();
}

void reset_peak_memory(const at::Device& device) {
#ifdef DIFFPIPE_HAVE_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(initialised_cuda_index(device));
#endif
  if (!device.is_cuda()) reset_peak_resident();
}

uint64_t peak_reserved_bytes(const at::Device& device) {
  if (!device.is_cuda()) return 0;
#ifdef DIFFPIPE_HAVE_CUDA
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(initialised_cuda_index(device));
  return static_cast<uint64_t>(stats.reserved_bytes[0].peak);
#else
  DP_FAIL("this build has no CUDA support");
#endif
}

void release_cached_memory(const at::Device& device) {
  if (!device.is_cuda()) return;
#ifdef DIFFPIPE_HAVE_CUDA
  at::globalContext().lazyInitDevice(at::kCUDA);
  c10::cuda::CUDACachingAllocator::emptyCache();
#else
  DP_FAIL("this build has no CUDA support");
#endif
}

}  // namespace dp::pipeline
