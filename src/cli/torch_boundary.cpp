#include "cli/torch_boundary.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <vector>

#include "cli/early_cuda.h"
#include "core/error.h"
#include "core/human_units.h"
#include "core/log.h"
#include "core/process_clock.h"
#include "io/parallel_load.h"

namespace dp::cli {
namespace {

// Collects LibTorch's warnings instead of printing them (with their source locations) to stderr.
class CollectedWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};

// Newlines and runs of spaces folded into single spaces, ends trimmed.
std::string one_line(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool space = c == '\n' || c == '\r' || c == '\t' || c == ' ';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace

std::string resolve_device_name(const std::string& name) {
  DP_CHECK(name == "auto" || name == "cpu" || name == "cuda", "--device: expected auto, cpu or cuda, got '", name, "'");
  if (name != "auto") return name;
  // Counting devices does not initialise CUDA; a GPU that is visible but unusable is refused by usable_device.
  CollectedWarnings quiet;
  const c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  return at::hasCUDA() ? "cuda" : "cpu";
}

at::Device usable_device(const std::string& name) {
  DP_CHECK(name == "cpu" || name == "cuda", "--device: expected cpu or cuda, got '", name, "'");
  if (name == "cpu") return at::Device(at::kCPU);
  // at::hasCUDA() only counts devices; initialising CUDA says why there are none (no driver, driver too old,
  // a LibTorch built without CUDA). Its warnings are collected rather than printed with source locations.
  CollectedWarnings warnings;
  const c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  if (at::hasCUDA()) return at::Device(at::kCUDA);
  std::string why = warnings.messages.empty() ? "no CUDA device is visible" : one_line(warnings.messages.front());
  try {
    at::globalContext().lazyInitDevice(at::kCUDA);
  } catch (const c10::Error& e) {
    why = one_line(e.what_without_backtrace());
  }
  if (why.back() != '.') why += '.';
  DP_FAIL("--device cuda: CUDA cannot be used here: ", why, " Run with --device cpu.");
}

namespace {

// What the start before main() did (cli/early_cuda.h); its context is let go when this run's device is another.
void settle_early_cuda(const at::Device& device) {
  const EarlyCudaStart early = wait_for_early_cuda();
  if (!early.attempted) return;
  const double ago = std::chrono::duration<double>(std::chrono::steady_clock::now() - early.began).count();
  DP_DEBUG("CUDA started before main(): ", early.outcome, " in ", human_seconds(early.seconds), ", from ",
           human_seconds(process_age_seconds() - ago), " after the process started (main() at ",
           human_seconds(age_at_main_seconds()), ")");
  if (early.context && (!device.is_cuda() || device.index() != early.device)) {
    release_early_cuda();
    DP_DEBUG("CUDA started before main(): released device ", early.device, "'s context, this run uses ", device.str());
  }
}

}  // namespace

std::future<void> open_device_in_background(const at::Device& device) {
  if (!device.is_cuda()) {
    settle_early_cuda(device);
    return {};
  }
  return std::async(std::launch::async, [device] {
    try {
      settle_early_cuda(device);
      const auto started = std::chrono::steady_clock::now();
      (void)at::empty({1}, at::TensorOptions().device(device));  // the context, and LibTorch's allocator for it
      DP_DEBUG("opened ", device.str(), " in the background in ",
               human_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()));
      io::prepare_pinned_staging(device);
    } catch (const std::exception& e) {
      DP_DEBUG("opening ", device.str(), " in the background failed (the run's own CUDA calls report it): ", e.what());
    }
  });
}

std::string default_dtype_for(const std::string& device) { return device == "cuda" ? "bf16" : "fp32"; }

void run_reporting_torch_errors(const std::function<void()>& work) {
  try {
    work();
  } catch (const c10::Error& e) {
    DP_DEBUG("LibTorch error in full:\n", e.what());
    // No [file:line] suffix: the location inside LibTorch helps nobody, and --log-level debug has it.
    throw Error("LibTorch: " + one_line(e.what_without_backtrace()), "LibTorch", 0);
  }
}

}  // namespace dp::cli
