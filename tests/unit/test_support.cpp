#include "test_support.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace fs = std::filesystem;

namespace dp::test {
namespace {

struct Cleanup {
  std::vector<std::string> dirs;
  ~Cleanup() {
    if (std::getenv("DIFFPIPE_KEEP_TEST_DIRS") != nullptr) return;
    for (const auto& d : dirs) {
      std::error_code ignored;
      fs::remove_all(d, ignored);
    }
  }
};
Cleanup cleanup;

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    ADD_FAILURE() << name << " is not set; run the tests through ctest";
    return {};
  }
  return value;
}

}  // namespace

std::string temp_dir(const std::string& tag) {
  std::string pattern = (fs::temp_directory_path() / ("diffpipe-" + tag + "-XXXXXX")).string();
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  const char* made = ::mkdtemp(buffer.data());
  if (made == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
  cleanup.dirs.push_back(made);
  return made;
}

std::string reference_dir() {
  const std::string dir = required_env("DIFFPIPE_REFERENCE_DIR");
  if (!dir.empty() && !fs::exists(fs::path(dir) / "DONE")) {
    ADD_FAILURE() << "oracle output missing in " << dir << ": the reference.generate test must run first";
  }
  return dir;
}

std::string source_dir() { return required_env("DIFFPIPE_SOURCE_DIR"); }
std::string diffpipe_binary() { return required_env("DIFFPIPE_BINARY"); }

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, got);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace dp::test
