// Run by cli_early_cuda_test as `cli_early_cuda_probe generate ...` with the fake driver on LD_LIBRARY_PATH: the
// early start's constructor (cli/early_cuda.h) sees this command line before main(). Prints what it did, what
// the driver saw, and what releasing changes, one `key=value` a line.
#include <dlfcn.h>

#include <cstdio>

#include "cli/early_cuda.h"

int main() {
  const auto early = dp::cli::wait_for_early_cuda();
  std::printf("attempted=%d\ncontext=%d\ndevice=%d\noutcome=%s\n", early.attempted, early.context, early.device,
              early.outcome.c_str());
  // The driver the constructor opened (RTLD_NOLOAD: nothing is loaded here that it did not load).
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  std::printf("driver_loaded=%d\n", driver != nullptr);
  if (driver == nullptr) return 0;
  const auto visible = reinterpret_cast<const char* (*)()>(dlsym(driver, "fake_cuda_visible_at_init"));
  const auto retained = reinterpret_cast<int (*)()>(dlsym(driver, "fake_cuda_retained"));
  if (visible == nullptr || retained == nullptr) {
    std::printf("fake_driver=0\n");
    return 0;
  }
  std::printf("visible_at_init=%s\nretained=%d\n", visible(), retained());
  dp::cli::release_early_cuda();
  std::printf("retained_after_release=%d\n", retained());
  return 0;
}
