// A stage that fails: the error reaches the caller (never std::terminate from the stage timer unwinding),
// the stage is logged as failed, and no success-looking report is left behind.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <regex>

#include "io/model_folder.h"
#include "core/error.h"
#include "pipeline/flux_pipeline.h"
#include "pipeline/phase_guard.h"
#include "test_support.h"

namespace dp::pipeline {
namespace {

TEST(PipelineStages, AStageOnAnUnusableDeviceThrowsAndReportsNothing) {
  if (at::hasCUDA()) GTEST_SKIP() << "CUDA works here";
  FluxPipeline flux(io::ModelFolder::open(dp::test::reference_dir() + "/pipeline/schnell_like/pipe"));
  GenerateRequest request;
  request.prompts = {"cat"};
  request.height = request.width = 32;
  request.steps = 1;
  request.dtype = at::kFloat;
  request.device = at::Device(at::kCUDA);
  // In a build without CUDA support the timer starts and the first copy to the device throws; the timer used
  // to synchronise the device while that error unwound, throw again and end the process in std::terminate.
  ::testing::internal::CaptureStderr();
  EXPECT_ANY_THROW(flux.encode_prompts(request));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(flux.reports().empty());
  EXPECT_FALSE(std::regex_search(log, std::regex("stage encode: [0-9.]+ (s|ms|us) \\(loading weights"))) << log;
}

// An allocation past a rank's cap surfaces as LibTorch's OutOfMemoryError, many lines long and naming neither
// the rank nor what was running; run_phase turns it into one line that does. (The real cap needs a GPU; the
// error is the one LibTorch's CUDA allocator throws.)
TEST(PhaseGuard, OutOfMemoryNamesRankAndPhase) {
  const auto exhausted = []() -> int {
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "CUDA out of memory. Tried to allocate 72.00 MiB. GPU 0 has a total capacity of 139.81 GiB of "
                     "which 120.2 GiB is free. Including non-PyTorch memory, this process has 15.50 GiB memory in use. "
                     "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
    return 0;
  };
  try {
    run_phase(1, "loading blocks [0, 27)", exhausted);
    FAIL() << "the out-of-memory error was swallowed";
  } catch (const dp::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 1 ran out of device memory while loading blocks [0, 27): CUDA out of memory. Tried to "
                           "allocate 72.00 MiB"), std::string::npos) << message;
    EXPECT_NE(message.find("15.50 GiB memory in use"), std::string::npos) << message;
    EXPECT_EQ(message.find("expandable_segments"), std::string::npos) << "the allocator advice is cut: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
  // Values pass through, other errors unchanged.
  EXPECT_EQ(run_phase(0, "decoding", [] { return 7; }), 7);
  EXPECT_THROW(run_phase(0, "decoding", []() -> int { DP_FAIL("not memory"); }), dp::Error);
  try {
    run_phase(0, "decoding", []() -> int { DP_FAIL("not memory"); });
  } catch (const dp::Error& e) {
    EXPECT_EQ(std::string(e.what()).find("ran out of device memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dp::pipeline
