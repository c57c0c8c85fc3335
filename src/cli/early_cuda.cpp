#include "cli/early_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace dp::cli {
namespace {

// The driver API's few entry points used here, resolved from libcuda.so.1 at run time: a build machine or a
// CPU-only machine has no driver, and linking one would stop diffpipe-torch from starting there at all.
using CuInit = int (*)(unsigned int);
using CuDeviceGetCount = int (*)(int*);
using CuDeviceGet = int (*)(int*, int);
using CuPrimaryCtxRetain = int (*)(void**, int);
using CuPrimaryCtxRelease = int (*)(int);

struct EarlyState {
  pthread_t thread{};
  bool running = false;  // a thread was started and not yet joined
  int local_rank = -1;
  int driver_device = -1;  // CUdevice handle of the context
  CuPrimaryCtxRetain retain = nullptr;
  CuPrimaryCtxRelease release = nullptr;
  EarlyCudaStart result;
  std::mutex mutex;  // wait / release from the program's threads
};

EarlyState& state() {
  static EarlyState s;  // constructed by the first call, from this library's constructor
  return s;
}

template <typename F>
F resolve(void* library, const char* name) {
  return reinterpret_cast<F>(dlsym(library, name));
}

// Runs in the constructor, on the loader's thread: everything that may load a library (dlopen, and cuInit,
// which may open driver components of its own) happens here, in order with the other libraries' initialisers;
// a second thread loading libraries while the loader still walks its list could run an initialiser twice.
// Returns the driver ordinal to open, or -1 with the outcome recorded.
int prepare_driver(EarlyState& s) {
  EarlyCudaStart& r = s.result;
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // kept open: the runtime uses the same driver
  if (driver == nullptr) {
    r.outcome = "no CUDA driver (libcuda.so.1 not found)";
    return -1;
  }
  const auto init = resolve<CuInit>(driver, "cuInit");
  const auto count_devices = resolve<CuDeviceGetCount>(driver, "cuDeviceGetCount");
  const auto get_device = resolve<CuDeviceGet>(driver, "cuDeviceGet");
  s.retain = resolve<CuPrimaryCtxRetain>(driver, "cuDevicePrimaryCtxRetain");
  s.release = resolve<CuPrimaryCtxRelease>(driver, "cuDevicePrimaryCtxRelease_v2");
  if (s.release == nullptr) s.release = resolve<CuPrimaryCtxRelease>(driver, "cuDevicePrimaryCtxRelease");
  if (!init || !count_devices || !get_device || !s.retain || !s.release) {
    r.outcome = "the CUDA driver lacks an entry point this start uses";
    return -1;
  }
  if (const int code = init(0); code != 0) {
    r.outcome = "cuInit failed (CUresult " + std::to_string(code) + ")";
    return -1;
  }
  int count = 0;
  if (const int code = count_devices(&count); code != 0 || count <= 0) {
    r.outcome = "no CUDA device is visible";
    return -1;
  }
  // As runtime::rank_device picks it: the local rank modulo the visible devices.
  r.device = s.local_rank % count;
  int device = 0;
  if (const int code = get_device(&device, r.device); code != 0) {
    r.outcome = "cuDeviceGet(" + std::to_string(r.device) + ") failed (CUresult " + std::to_string(code) + ")";
    return -1;
  }
  return device;
}

// The thread: the primary context, the part that takes longest (about 0.1-0.15 s on an H100).
void* create_context(void*) {
  EarlyState& s = state();
  EarlyCudaStart& r = s.result;
  void* context = nullptr;
  const int code = s.retain(&context, s.driver_device);
  if (code != 0) {
    r.outcome = "creating the primary context failed (CUresult " + std::to_string(code) + ")";
  } else {
    r.context = true;
    r.outcome = "driver and primary context of device " + std::to_string(r.device) + " ready";
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.began).count();
  return nullptr;
}

void join_early_thread() {
  EarlyState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.running) return;
  pthread_join(s.thread, nullptr);
  s.running = false;
}

const char* process_getenv(const char* name) { return std::getenv(name); }

int parse_rank(const char* text) {
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return (*end == '\0' && value >= 0 && value < 1 << 20) ? static_cast<int>(value) : -1;
}

// Run by the dynamic loader before main(), first of all the libraries' initialisers (linked -z initfirst);
// glibc passes the command line to ELF constructors.
__attribute__((constructor)) void start_early_cuda(int argc, char** argv, char** environment) {
  // Running before libc's own initialiser, which sets `environ` from the same array: until then getenv() finds
  // nothing, for this code and for the driver's cuInit, which reads CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and
  // CUDA_MODULE_LOADING once and for the whole process. Set here as libc would.
  if (environ == nullptr) environ = environment;
  EarlyState& s = state();
  std::string why;
  s.local_rank = early_cuda_device(argc, argv, process_getenv, &why);
  if (s.local_rank < 0) {
    s.result.outcome = why;
    return;
  }
  s.result.attempted = true;
  s.result.began = std::chrono::steady_clock::now();
  s.driver_device = prepare_driver(s);
  if (s.driver_device < 0) {
    s.result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.result.began).count();
    return;
  }
  if (pthread_create(&s.thread, nullptr, create_context, nullptr) != 0) {
    s.result.outcome = "could not start a thread";
    return;
  }
  s.running = true;
  // A process that ends before asking (a bad option, --version) must not leave the driver mid-initialisation.
  std::atexit(join_early_thread);
}

}  // namespace

int early_cuda_device(int argc, const char* const* argv, const char* (*getenv)(const char*), std::string* why) {
  const auto refuse = [&](const char* reason) {
    if (why) *why = reason;
    return -1;
  };
  // On unless turned off: 0.12 s less from command to PNG on an H100 (bench/RESULTS.md, 2026-12-05, session 4).
  const char* setting = getenv("DIFFPIPE_EARLY_CUDA");
  if (setting != nullptr && std::strcmp(setting, "0") == 0) return refuse("DIFFPIPE_EARLY_CUDA=0");
  // The command: the first argument that is not an option or the global --log-level's value (as main() reads it).
  int named = 0;
  for (int i = 1; i < argc && named == 0; ++i) {
    if (std::strcmp(argv[i], "--log-level") == 0) {
      ++i;
    } else if (argv[i][0] != '-') {
      named = i;
    }
  }
  if (named == 0 || std::strcmp(argv[named], "generate") != 0) return refuse("not a generate command");
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0 || std::strcmp(a, "--dry-run") == 0)
      return refuse("--help or --dry-run");
    if (std::strcmp(a, "--device=cpu") == 0 || (std::strcmp(a, "--device") == 0 && i + 1 < argc &&
                                                 std::strcmp(argv[i + 1], "cpu") == 0))
      return refuse("--device cpu");
  }
  // The launchers runtime::World knows; only Open MPI's says the local rank before MPI_Init.
  const bool launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_SIZE") || getenv("PMI_SIZE") ||
                        getenv("SLURM_STEP_ID");
  if (!launched) return 0;
  const int local = parse_rank(getenv("OMPI_COMM_WORLD_LOCAL_RANK"));
  return local >= 0 ? local : refuse("a launcher that does not say the local rank before MPI_Init");
}

EarlyCudaStart wait_for_early_cuda() {
  join_early_thread();
  return state().result;
}

void release_early_cuda() {
  EarlyState& s = state();
  join_early_thread();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.result.context) return;
  s.release(s.driver_device);
  s.result.context = false;
  s.result.outcome += "; released (the run uses another device)";
}

}  // namespace dp::cli
