// Which command lines start the CUDA driver before main() (cli/early_cuda.h), and what a process without a
// driver gets: nothing started, the reason said. Then the start itself, before main() in a process of its own,
// against a stand-in driver (fake_cuda/) that records what it was asked: the environment it saw at cuInit, the
// device, the context held and let go. Torch-free: the library needs only libc and the loader.
#include "cli/early_cuda.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {

std::map<std::string, std::string> environment;

const char* fake_getenv(const char* name) {
  const auto found = environment.find(name);
  return found == environment.end() ? nullptr : found->second.c_str();
}

// The device the command line and `environment` would start, or -1 with the reason in `why`.
int decide(std::vector<const char*> words, std::string* why = nullptr) {
  words.insert(words.begin(), "diffpipe-torch");
  return dp::cli::early_cuda_device(static_cast<int>(words.size()), words.data(), fake_getenv, why);
}

class EarlyCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    environment.clear();
    environment["DIFFPIPE_EARLY_CUDA"] = "1";
  }
};

TEST_F(EarlyCuda, StartsDeviceZeroForAPlainGenerate) {
  EXPECT_EQ(decide({"generate", "--model", "m", "--prompt", "a cat"}), 0);
  EXPECT_EQ(decide({"--log-level", "debug", "generate", "--device", "cuda"}), 0);
  EXPECT_EQ(decide({"generate", "--device", "auto"}), 0);
}

TEST_F(EarlyCuda, LeavesOtherCommandsAndCpuRunsAlone) {
  std::string why;
  EXPECT_EQ(decide({"plan", "--model", "m"}, &why), -1);
  EXPECT_EQ(why, "not a generate command");
  EXPECT_EQ(decide({"--version"}), -1);
  EXPECT_EQ(decide({}), -1);
  // The value of --log-level is not the command.
  EXPECT_EQ(decide({"--log-level", "generate", "forward"}), -1);
  EXPECT_EQ(decide({"generate", "--device", "cpu"}, &why), -1);
  EXPECT_EQ(why, "--device cpu");
  EXPECT_EQ(decide({"generate", "--device=cpu"}), -1);
  EXPECT_EQ(decide({"generate", "--help"}), -1);
  EXPECT_EQ(decide({"generate", "-h"}), -1);
  EXPECT_EQ(decide({"generate", "--dry-run"}), -1);
}

TEST_F(EarlyCuda, IsOnUnlessTurnedOff) {
  std::string why;
  environment.erase("DIFFPIPE_EARLY_CUDA");
  EXPECT_EQ(decide({"generate"}), 0);
  environment["DIFFPIPE_EARLY_CUDA"] = "0";
  EXPECT_EQ(decide({"generate"}, &why), -1);
  EXPECT_EQ(why, "DIFFPIPE_EARLY_CUDA=0");
}

TEST_F(EarlyCuda, UnderALauncherOnlyOpenMpisLocalRankNamesTheDevice) {
  environment["OMPI_COMM_WORLD_SIZE"] = "4";
  environment["OMPI_COMM_WORLD_LOCAL_RANK"] = "3";
  EXPECT_EQ(decide({"generate"}), 3);
  environment["OMPI_COMM_WORLD_LOCAL_RANK"] = "x";
  EXPECT_EQ(decide({"generate"}), -1);
  environment.erase("OMPI_COMM_WORLD_SIZE");
  environment.erase("OMPI_COMM_WORLD_LOCAL_RANK");
  std::string why;
  environment["SLURM_STEP_ID"] = "0";  // srun: the local rank comes from MPI_Init, after main()
  EXPECT_EQ(decide({"generate"}, &why), -1);
  EXPECT_NE(why.find("local rank"), std::string::npos) << why;
}

// This test binary is not `generate`: the constructor started nothing, and waiting or releasing is harmless.
TEST_F(EarlyCuda, ATestProcessStartsNothing) {
  const auto early = dp::cli::wait_for_early_cuda();
  EXPECT_FALSE(early.attempted);
  EXPECT_FALSE(early.context);
  EXPECT_FALSE(early.outcome.empty());
  dp::cli::release_early_cuda();
  EXPECT_FALSE(dp::cli::wait_for_early_cuda().context);
}

// Runs the probe as `probe ARGS...` in an environment of exactly `variables` (and the stand-in driver's folder on
// LD_LIBRARY_PATH); returns its `key=value` lines.
std::map<std::string, std::string> probe(const std::vector<std::string>& variables, const std::string& args) {
  std::string command = "env -i LD_LIBRARY_PATH=" DIFFPIPE_FAKE_CUDA_DIR;
  for (const auto& v : variables) command += " '" + v + "'";
  command += " " DIFFPIPE_EARLY_CUDA_PROBE " " + args;
  std::map<std::string, std::string> out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::string text(line);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    const auto equals = text.find('=');
    if (equals != std::string::npos) out[text.substr(0, equals)] = text.substr(equals + 1);
  }
  out["exit"] = std::to_string(pclose(pipe));
  return out;
}

TEST(EarlyCudaStart, TheDriverSeesTheEnvironmentAndTheContextIsHeldUntilReleased) {
  // Before libc's own initialiser the process has no `environ`; cuInit must still see CUDA_VISIBLE_DEVICES.
  auto got = probe({"DIFFPIPE_EARLY_CUDA=1", "CUDA_VISIBLE_DEVICES=3,5"}, "generate --model m");
  EXPECT_EQ(got["exit"], "0");
  EXPECT_EQ(got["attempted"], "1");
  EXPECT_EQ(got["visible_at_init"], "3,5");
  EXPECT_EQ(got["context"], "1") << got["outcome"];
  EXPECT_EQ(got["device"], "0");
  EXPECT_EQ(got["retained"], "1");
  EXPECT_EQ(got["retained_after_release"], "0");
}

TEST(EarlyCudaStart, OpenMpisLocalRankPicksTheDeviceAsTheRuntimeWould) {
  // Local rank 3 of 2 visible devices: 3 % 2, as runtime::rank_device computes it.
  auto got = probe({"DIFFPIPE_EARLY_CUDA=1", "CUDA_VISIBLE_DEVICES=0,1", "OMPI_COMM_WORLD_SIZE=4",
                    "OMPI_COMM_WORLD_LOCAL_RANK=3"}, "--log-level debug generate");
  EXPECT_EQ(got["context"], "1") << got["outcome"];
  EXPECT_EQ(got["device"], "1");
}

TEST(EarlyCudaStart, NothingStartsUnlessAsked) {
  for (const auto& [variables, args] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"DIFFPIPE_EARLY_CUDA=0"}, "generate"}, {{}, "generate --device cpu"}, {{}, "plan"}}) {
    auto got = probe(variables, args);
    EXPECT_EQ(got["attempted"], "0") << args;
    EXPECT_EQ(got["driver_loaded"], "0") << args;
  }
}

TEST(EarlyCudaStart, NoVisibleDeviceIsSaidAndHoldsNothing) {
  auto got = probe({"DIFFPIPE_EARLY_CUDA=1", "CUDA_VISIBLE_DEVICES="}, "generate");
  EXPECT_EQ(got["attempted"], "1");
  EXPECT_EQ(got["context"], "0");
  EXPECT_EQ(got["outcome"], "no CUDA device is visible");
  EXPECT_EQ(got["retained"], "0");
}

}  // namespace
