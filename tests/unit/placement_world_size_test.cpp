// plan's --world-size: absent means "infer from --max-memory", every given value must be in [1, kMaxWorldSize],
// and the largest world plans in well under a second (MaxMemory once sorted itself on every insert and
// scanned on every lookup: 12 s at 20000 GPUs).
#include <gtest/gtest.h>

#include <chrono>

#include "core/error.h"
#include "placement/plan.h"
#include "test_support.h"

namespace dp::placement {
namespace {

// A header-only FLUX.1-dev transformer folder, written once for the whole run.
const std::string& flux_dev_headers() {
  static const std::string dir = [] {
    const std::string d = dp::test::temp_dir("world-size") + "/flux-dev";
    const auto made = dp::test::run_command(dp::test::diffpipe_binary() + " make-random --arch flux-dev --sparse --out " + d);
    EXPECT_EQ(made.exit_code, 0) << made.output;
    return d;
  }();
  return dir;
}

dp::test::CommandResult plan(const std::string& args) {
  return dp::test::run_command(dp::test::diffpipe_binary() + " plan --model " + flux_dev_headers() + " " + args);
}

TEST(PlanWorldSize, ZeroAndNegativesAreErrorsAndAbsentInfers) {
  for (const char* value : {"0", "-3", "100000"}) {
    const auto r = plan(std::string("--world-size ") + value);
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_NE(r.output.find(std::string("--world-size must be positive and at most 4096, got ") + value), std::string::npos)
        << r.output;
  }
  const auto inferred = plan("--json --max-memory 0=30GB,2=30GB 2>/dev/null");
  ASSERT_EQ(inferred.exit_code, 0) << inferred.output;
  EXPECT_EQ(nlohmann::json::parse(inferred.output)["world_size"], 3);
  const auto alone = plan("--json 2>/dev/null");
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  EXPECT_EQ(nlohmann::json::parse(alone.output)["world_size"], 1);
  const auto too_far = plan("--max-memory 5000=30GB");
  EXPECT_EQ(too_far.exit_code, 3) << too_far.output;
  EXPECT_NE(too_far.output.find("makes a world of 5001 GPUs; at most 4096"), std::string::npos) << too_far.output;
  const auto help = dp::test::run_command(dp::test::diffpipe_binary() + " plan --help");
  EXPECT_NE(help.output.find("1 to 4096; left out, one past the highest GPU --max-memory names"), std::string::npos)
      << help.output;
}

TEST(PlanWorldSize, TheLargestWorldPlansQuickly) {
  PlanRequest request;
  request.model_dir = flux_dev_headers();
  request.world_size = kMaxWorldSize;
  request.gpu_memory_bytes = 2'000'000'000;  // small GPUs: the map spreads over many of them
  const auto started = std::chrono::steady_clock::now();
  const auto result = make_plan(request);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(result["world_size"], kMaxWorldSize);
  EXPECT_EQ(result["devices"].size(), static_cast<size_t>(kMaxWorldSize) + 1);  // every GPU and the cpu
  EXPECT_LT(seconds, 1.0);  // quadratic before: about 2.5 s here
  request.world_size = 0;
  EXPECT_THROW(make_plan(request), Error);
}

}  // namespace
}  // namespace dp::placement
