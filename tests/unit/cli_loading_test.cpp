// How `generate` loads: its transformer blocks loading on a thread while the text encoders run (--load-overlap)
// and the blocks' warm-up leave the result bit-identical, the log says which overlap was chosen and why, and
// --report-json states each load's rate and page-cache state and the first step's cost.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <string>

#include "core/json_file.h"
#include "fixtures/tiny_pipeline.h"
#include "io/hdf5_latents.h"
#include "test_support.h"

namespace dp {
namespace {

struct GenerateRun {
  test::CommandResult result;
  io::LatentsFile latents;
};

GenerateRun generate(const std::string& pipe, const std::string& tag, const std::string& args) {
  const std::string out = test::temp_dir(tag);
  GenerateRun run;
  run.result = test::run_command(test::diffpipe_binary() + " generate --model " + pipe +
                                 " --prompt 'a red cube' --height 48 --width 32 --steps 3 --output-type latent --out " +
                                 out + "/x.h5 --report-json " + out + "/report.json " + args + " 2>&1");
  if (run.result.exit_code == 0) run.latents = io::read_latents_hdf5(out + "/x.h5");
  return run;
}

bool same_bits(const io::LatentsFile& a, const io::LatentsFile& b) {
  return a.shape == b.shape && a.values.size() == b.values.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(GenerateLoading, OverlapAndWarmUpLeaveTheLatentsBitIdentical) {
  const std::string pipe = test::temp_dir("loading-pipe");
  fixtures::write_tiny_pipeline(pipe, {});
  const GenerateRun staged = generate(pipe, "loading-staged", "--load-overlap off --no-warm-up");
  ASSERT_EQ(staged.result.exit_code, 0) << staged.result.output;
  EXPECT_TRUE(contains(staged.result.output, "load overlap off: --load-overlap off")) << staged.result.output;
  EXPECT_FALSE(contains(staged.result.output, "warmed up")) << staged.result.output;

  const GenerateRun overlapped = generate(pipe, "loading-overlapped", "--load-overlap on");
  ASSERT_EQ(overlapped.result.exit_code, 0) << overlapped.result.output;
  EXPECT_TRUE(contains(overlapped.result.output, "load overlap on: --load-overlap on")) << overlapped.result.output;
  EXPECT_TRUE(contains(overlapped.result.output, "of blocks load while the text encoders")) << overlapped.result.output;
  EXPECT_TRUE(contains(overlapped.result.output, "warmed up one block of each kind")) << overlapped.result.output;
  EXPECT_TRUE(contains(overlapped.result.output, "warmed up the loop's kernels")) << overlapped.result.output;
  EXPECT_TRUE(same_bits(staged.latents, overlapped.latents)) << "overlap and warm-up changed the latents";
  // The blocks' load waits for the encoders' weights rather than compete with T5's.
  const auto t5_loaded = overlapped.result.output.find("load " + pipe + "/text_encoder_2:");
  const auto blocks_loaded = overlapped.result.output.find("load " + pipe + "/transformer:");
  ASSERT_NE(t5_loaded, std::string::npos) << overlapped.result.output;
  ASSERT_NE(blocks_loaded, std::string::npos) << overlapped.result.output;
  EXPECT_LT(t5_loaded, blocks_loaded) << overlapped.result.output;

  // Auto on the CPU keeps the staged order, and says why.
  const GenerateRun automatic = generate(pipe, "loading-auto", "");
  ASSERT_EQ(automatic.result.exit_code, 0) << automatic.result.output;
  EXPECT_TRUE(contains(automatic.result.output, "load overlap off: on the CPU")) << automatic.result.output;
  EXPECT_TRUE(contains(automatic.result.output, "warmed up the loop's kernels")) << automatic.result.output;
  EXPECT_TRUE(same_bits(staged.latents, automatic.latents));
}

TEST(GenerateLoading, ReportStatesLoadRatesPageCacheAndFirstStep) {
  const std::string pipe = test::temp_dir("loading-report-pipe");
  fixtures::write_tiny_pipeline(pipe, {});
  const std::string out = test::temp_dir("loading-report");
  const auto r = test::run_command(test::diffpipe_binary() + " generate --model " + pipe +
                                   " --prompt cat --height 32 --width 32 --steps 3 --out " + out +
                                   "/x.png --report-json " + out + "/report.json 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto report = read_json_file(out + "/report.json");
  ASSERT_TRUE(report.contains("loads") && report["loads"].is_array()) << report.dump(2);
  std::set<std::string> components;
  for (const auto& load : report["loads"]) {
    components.insert(std::filesystem::path(load["source"].get<std::string>()).filename().string());
    EXPECT_GT(load["bytes"].get<double>(), 0) << load.dump();
    EXPECT_GE(load["page_cache_resident_fraction"].get<double>(), 0) << load.dump();
    EXPECT_LE(load["page_cache_resident_fraction"].get<double>(), 1) << load.dump();
    EXPECT_GT(load["gb_per_s"].get<double>(), 0) << load.dump();
  }
  EXPECT_EQ(components, (std::set<std::string>{"text_encoder", "text_encoder_2", "transformer", "vae"}));
  EXPECT_GT(report["first_step_ratio"].get<double>(), 0) << report.dump(2);
  EXPECT_GT(report["steady_step_seconds"].get<double>(), 0) << report.dump(2);
  EXPECT_TRUE(contains(r.output, "% was in the page cache before")) << r.output;
  // The process wall's parts no stage sees: start to main(), and to the outputs on disk.
  const double to_main = report["process_start_to_main_seconds"].get<double>();
  const double to_outputs = report["process_start_to_outputs_seconds"].get<double>();
  EXPECT_GE(to_main, 0) << report.dump(2);
  EXPECT_GE(to_outputs, to_main + report["total_seconds"].get<double>() - 0.02) << report.dump(2);  // 10 ms ticks
  EXPECT_TRUE(contains(r.output, "(process start to main(): loading LibTorch's and CUDA's libraries)")) << r.output;
}

}  // namespace
}  // namespace dp
