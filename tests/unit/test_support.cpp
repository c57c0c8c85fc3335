#include "test_support.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <ftw.h>
#include <sys/stat.h>
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

int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }

}  // namespace

// libtorch.so exports its own std::filesystem::remove_all, which crashes when called from here (it
// resolves to a null function), so trees are removed with nftw instead.
void remove_tree(const std::string& path) { ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

namespace {

// Removes the temp dirs when the tests end, inside RUN_ALL_TESTS: at exit-handler time LibTorch's own copy
// of std::filesystem may already be torn down, and calling it then crashes.
class Cleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    if (std::getenv("DIFFPIPE_KEEP_TEST_DIRS") != nullptr) return;
    for (const auto& d : dirs) remove_tree(d);
    dirs.clear();
  }
  std::vector<std::string> dirs;
};
Cleanup& cleanup = *static_cast<Cleanup*>(::testing::AddGlobalTestEnvironment(new Cleanup));

std::string setting(const char* name, const char* built_in) {
  const char* value = std::getenv(name);
  if (value != nullptr && *value != '\0') return value;
  if (built_in != nullptr && *built_in != '\0') return built_in;
  ADD_FAILURE() << name << " is not set and no built-in location exists";
  return {};
}

#ifndef DIFFPIPE_TEST_REFERENCE_DIR
#define DIFFPIPE_TEST_REFERENCE_DIR ""
#define DIFFPIPE_TEST_SOURCE_DIR ""
#define DIFFPIPE_TEST_BINARY ""
#endif

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
  const std::string dir = setting("DIFFPIPE_REFERENCE_DIR", DIFFPIPE_TEST_REFERENCE_DIR);
  if (!dir.empty() && !fs::exists(fs::path(dir) / "DONE")) {
    ADD_FAILURE() << "oracle output missing in " << dir << ": the reference.generate test must run first";
  }
  return dir;
}

std::string source_dir() { return setting("DIFFPIPE_SOURCE_DIR", DIFFPIPE_TEST_SOURCE_DIR); }
std::string diffpipe_binary() { return setting("DIFFPIPE_BINARY", DIFFPIPE_TEST_BINARY); }

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

bool cuda_tests_enabled() { return at::hasCUDA(); }

}  // namespace dp::test
