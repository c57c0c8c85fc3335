#pragma once
// Helpers shared by the unit tests: fixture folders and the oracle's output location.
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

}  // namespace dp::test
