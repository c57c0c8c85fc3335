// A stand-in for libcuda.so.1 with the five entry points cli/early_cuda uses, for the CPU machines where no
// driver exists: it records what the early start asked of it, above all the CUDA_VISIBLE_DEVICES that cuInit
// found in the environment (the real driver reads it once, at cuInit, for the whole process). Loaded only by
// cli_early_cuda_probe, through LD_LIBRARY_PATH; the real driver is exercised on the GPU machine.
#include <cstdlib>
#include <cstring>
#include <string>

namespace {
int device_count = 0;
int retained = 0;
std::string visible_at_init = "(cuInit not called)";
}  // namespace

extern "C" {

__attribute__((visibility("default"))) int cuInit(unsigned int) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  visible_at_init = visible == nullptr ? "(unset)" : visible;
  if (visible == nullptr) {
    device_count = 8;
  } else {
    device_count = *visible == '\0' ? 0 : 1;
    for (const char* c = visible; *c != '\0'; ++c) device_count += *c == ',';
  }
  return 0;
}

__attribute__((visibility("default"))) int cuDeviceGetCount(int* count) {
  *count = device_count;
  return 0;
}

__attribute__((visibility("default"))) int cuDeviceGet(int* device, int ordinal) {
  if (ordinal < 0 || ordinal >= device_count) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *device = ordinal;
  return 0;
}

__attribute__((visibility("default"))) int cuDevicePrimaryCtxRetain(void** context, int) {
  ++retained;
  *context = &retained;
  return 0;
}

__attribute__((visibility("default"))) int cuDevicePrimaryCtxRelease_v2(int) {
  --retained;
  return 0;
}

// For the probe: what the early start left behind.
__attribute__((visibility("default"))) const char* fake_cuda_visible_at_init() { return visible_at_init.c_str(); }
__attribute__((visibility("default"))) int fake_cuda_retained() { return retained; }
}
