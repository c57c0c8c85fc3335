#pragma once
// What the LibTorch commands (generate, forward) share where the user's request meets LibTorch: the device
// they named, checked before any work, the dtype that device computes in by default, and LibTorch's errors
// turned into one line.
#include <ATen/ATen.h>

#include <functional>
#include <future>
#include <string>

namespace dp::cli {

// --device auto (the default): "cuda" when LibTorch sees a CUDA device, else "cpu"; "cpu" and "cuda" as given.
std::string resolve_device_name(const std::string& name);

// "cpu" or "cuda" as a device. "cuda" where no CUDA device can be used (a CPU-only LibTorch, no driver, no
// GPU) is refused with one line saying why, instead of failing deep inside the first stage.
at::Device usable_device(const std::string& name);

// Opens `device` on a thread: the driver's CUDA context (0.15-0.25 s on an H100) and then the loaders' pinned
// staging (io::prepare_pinned_staging), while the caller checks the folder and plans. The caller's first CUDA
// call waits for the context by itself (LibTorch initialises a device once); the future is for the caller's
// scope to end after the thread. Failures are left to the caller's own CUDA calls to report. Nothing off CUDA.
std::future<void> open_device_in_background(const at::Device& device);

// The --dtype a command runs in when none is given: fp32 on CPU (bf16 matmuls and convolutions are many
// times slower there: a 1024x1024 VAE decode takes 110 s in bf16 against 2.8 s in fp32), bf16 on CUDA.
std::string default_dtype_for(const std::string& device);

// Runs a command's work. A c10::Error's what() carries 20-30 lines of C++ backtrace: it is rethrown as a
// dp::Error holding only what_without_backtrace() on one line, and the full text is logged at debug level.
void run_reporting_torch_errors(const std::function<void()>& work);

}  // namespace dp::cli
