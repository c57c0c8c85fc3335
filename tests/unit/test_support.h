#pragma once
// Helpers shared by the unit tests: fixture folders and the oracle's output location.
#include <cstdlib>
#include <string>

namespace dp::test {

// A fresh, empty directory under the system temp dir, removed at process exit.
std::string temp_dir(const std::string& tag);
// The folder the oracle script (tests/reference) wrote; fails the test when it is missing.
std::string reference_dir();
std::string source_dir();
// Path of the built `diffpipe` binary, for CLI tests.
std::string diffpipe_binary();
// Deletes a directory tree (std::filesystem::remove_all is unusable next to LibTorch, see the .cpp).
void remove_tree(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
CommandResult run_command(const std::string& command);

// Whether CUDA tests should run here: true with a GPU; false without one, unless DIFFPIPE_REQUIRE_CUDA is
// set (bench/gpu.sh sets it), which makes a missing GPU a test failure instead of a skip.
bool cuda_tests_enabled();

}  // namespace dp::test

// For the start of a CUDA test: skips it on machines without a GPU (CI), fails it where one is required.
#define DP_TEST_NEED_CUDA()                                                                              \
  do {                                                                                                   \
    if (!::dp::test::cuda_tests_enabled()) {                                                             \
      if (std::getenv("DIFFPIPE_REQUIRE_CUDA") != nullptr) FAIL() << "DIFFPIPE_REQUIRE_CUDA is set but no GPU is visible"; \
      GTEST_SKIP() << "no CUDA device on this machine";                                                  \
    }                                                                                                    \
  } while (0)

namespace dp::test {

}  // namespace dp::test
