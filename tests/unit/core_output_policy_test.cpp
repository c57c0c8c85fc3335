// The output policy (core/output_policy.h) on a real file system: links, FIFOs, devices, hard links, a run's
// colliding paths and a file system that fills up. Torch-free: links only diffpipe::core.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/output_policy.h"

namespace fs = std::filesystem;

namespace dp {
namespace {

// The scratch folders of this process, removed when its tests end (ctest runs each test in a process of its own).
class ScratchFolders : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& dir : dirs) {
      std::error_code ignored;  // a folder a test left unreadable stays; nothing else depends on it
      fs::remove_all(dir, ignored);
    }
  }
  std::vector<std::string> dirs;
};
ScratchFolders& scratch = *static_cast<ScratchFolders*>(::testing::AddGlobalTestEnvironment(new ScratchFolders));

std::string temp_dir(const std::string& name) {
  std::string pattern = (fs::temp_directory_path() / ("diffpipe-" + name + "-XXXXXX")).string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  scratch.dirs.push_back(pattern);
  return pattern;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string thrown_by(const std::function<void()>& work) {
  try {
    work();
  } catch (const Error& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

#define EXPECT_MESSAGE(work, text)                                       \
  do {                                                                   \
    const std::string message_ = thrown_by(work);                        \
    EXPECT_NE(message_.find(text), std::string::npos) << message_;       \
  } while (0)

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(OutputPolicy, ALinkAsTheLastComponentIsRefusedAndItsTargetUntouched) {
  const auto dir = temp_dir("policy-link");
  fs::create_directory(dir + "/results");
  write_text(dir + "/results/real.png", "precious");
  fs::create_symlink("results/real.png", dir + "/link.png");
  EXPECT_MESSAGE([&] { check_output_path(dir + "/link.png"); }, "is a symbolic link (to results/real.png)");
  EXPECT_MESSAGE([&] { write_file_atomically(dir + "/link.png", "new"); }, "does not write through links");
  // A dangling link too: writing it would create a file wherever it points.
  fs::create_symlink("/nonexistent-diffpipe-target", dir + "/dangling.png");
  EXPECT_MESSAGE([&] { check_output_path(dir + "/dangling.png"); }, "is a symbolic link");
  EXPECT_EQ(read_text(dir + "/results/real.png"), "precious");
  EXPECT_TRUE(fs::is_symlink(dir + "/link.png"));
  EXPECT_FALSE(fs::exists("/nonexistent-diffpipe-target"));
  // A link among the folders on the way is followed as usual.
  fs::create_directory_symlink("results", dir + "/via");
  write_file_atomically(dir + "/via/new.png", "through a linked folder");
  EXPECT_EQ(read_text(dir + "/results/new.png"), "through a linked folder");
  EXPECT_EQ(names_in(dir + "/results"), (std::vector<std::string>{"new.png", "real.png"}));
}

TEST(OutputPolicy, ALinkPlantedAfterTheCheckIsReplacedNeverFollowed) {
  const auto dir = temp_dir("policy-race");
  write_text(dir + "/victim", "precious");
  AtomicFile file(dir + "/out.h5");  // checked now: absent
  write_text(file.temp_path(), "result");
  fs::create_symlink(dir + "/victim", dir + "/out.h5");  // planted between the check and the commit
  file.commit();
  EXPECT_FALSE(fs::is_symlink(dir + "/out.h5"));
  EXPECT_EQ(read_text(dir + "/out.h5"), "result");
  EXPECT_EQ(read_text(dir + "/victim"), "precious");
}

TEST(OutputPolicy, AHardLinkedOutputReplacesTheNameNotTheOtherLinksContent) {
  const auto dir = temp_dir("policy-hardlink");
  write_text(dir + "/input.txt", "a prompt");
  fs::create_hard_link(dir + "/input.txt", dir + "/out.png");
  write_file_atomically(dir + "/out.png", "an image");
  EXPECT_EQ(read_text(dir + "/out.png"), "an image");
  EXPECT_EQ(read_text(dir + "/input.txt"), "a prompt");
}

TEST(OutputPolicy, FifosSocketsDevicesAndFoldersAreRefusedDevNullDiscards) {
  const auto dir = temp_dir("policy-special");
  ASSERT_EQ(::mkfifo((dir + "/pipe").c_str(), 0600), 0);
  EXPECT_MESSAGE([&] { check_output_path(dir + "/pipe"); }, "is a FIFO (named pipe); diffpipe writes only regular files");
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string socket_path = dir + "/socket";
  std::strncpy(address.sun_path, socket_path.c_str(), sizeof address.sun_path - 1);
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  EXPECT_MESSAGE([&] { check_output_path(socket_path); }, "is a socket");
  ::close(sock);
  EXPECT_MESSAGE([&] { check_output_path("/dev/full"); }, "is a character device");
  EXPECT_MESSAGE([&] { AtomicFile f("/dev/zero"); }, "is a character device");
  fs::create_directory(dir + "/folder");
  EXPECT_MESSAGE([&] { check_output_path(dir + "/folder"); }, "is a directory");
  EXPECT_MESSAGE([&] { check_output_path(dir + "/missing/x.png"); }, "does not exist");
  EXPECT_MESSAGE([&] { check_output_path(""); }, "empty");
  // procfs accepts no new files, not even from root: the check tries for real rather than trusting permissions.
  EXPECT_MESSAGE([&] { check_output_path("/proc/diffpipe-out.png"); }, "cannot create");
  // /dev/null takes an output and stays what it is; nothing is left in $TMPDIR or /dev.
  check_output_path("/dev/null");
  write_file_atomically("/dev/null", "discarded");
  struct stat st {};
  ASSERT_EQ(::lstat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_TRUE(is_dev_null("/dev/null"));
  EXPECT_FALSE(is_dev_null("/dev/zero"));
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"folder", "pipe", "socket"}));
}

TEST(OutputPolicy, CollidingPathsAreRefusedNamingBothOptions) {
  using Use = RunPath::Use;
  const auto dir = temp_dir("policy-collide");
  fs::create_directories(dir + "/model/transformer");
  write_text(dir + "/prompts.txt", "a cat\n");
  write_text(dir + "/cache.h5", "");
  fs::create_directory_symlink(dir, dir + "/alias");
  fs::create_hard_link(dir + "/prompts.txt", dir + "/hard.txt");

  EXPECT_MESSAGE(([&] { check_distinct_paths({{"--out", dir + "/x.png", Use::output},
                                              {"--report-json", dir + "/./x.png", Use::output}}); }),
                 "--out " + dir + "/x.png and --report-json " + dir + "/./x.png are the same file");
  EXPECT_MESSAGE(([&] { check_distinct_paths({{"--out", dir + "/cache.h5", Use::output},
                                              {"--embeddings-cache", dir + "/alias/cache.h5", Use::input_output}}); }),
                 "are the same file");
  EXPECT_MESSAGE(([&] { check_distinct_paths({{"--prompts-file", dir + "/prompts.txt", Use::input},
                                              {"--out", dir + "/hard.txt", Use::output}}); }),
                 "one inode under two names");
  EXPECT_MESSAGE(([&] { check_distinct_paths({{"--model", dir + "/model", Use::input_folder},
                                              {"--out", dir + "/alias/model/transformer/x.h5", Use::output}}); }),
                 "is inside --model");
  EXPECT_MESSAGE(([&] { check_distinct_paths({{"--model", dir + "/model", Use::input_folder},
                                              {"--checkpoint-dir", dir + "/model", Use::output_folder}}); }),
                 "never writes into a folder it reads");
  EXPECT_MESSAGE(([&] { check_distinct_paths({{"--checkpoint-dir", dir + "/model/ck", Use::output_folder},
                                              {"--model", dir + "/model", Use::input_folder}}); }),
                 "--checkpoint-dir " + dir + "/model/ck is inside --model");
  EXPECT_MESSAGE(([&] { check_distinct_paths({{"--resume", dir + "/ck/step.h5", Use::input},
                                              {"--out", dir + "/ck/step.h5", Use::output}}); }),
                 "the run would overwrite what it reads");
  // What may be shared: inputs with each other, outputs all discarded to /dev/null, outputs beside checkpoints.
  check_distinct_paths({{"--prompts-file", dir + "/prompts.txt", Use::input},
                        {"--config", dir + "/hard.txt", Use::input},
                        {"--out", "/dev/null", Use::output},
                        {"--report-json", "/dev/null", Use::output},
                        {"--checkpoint-dir", dir + "/ck", Use::output_folder},
                        {"--out", dir + "/ck/result.h5", Use::output},
                        {"--model", dir + "/model", Use::input_folder},
                        {"--out", dir + "/model-result.png", Use::output}});
}

// Runs `work` in a child and returns what it printed on its pipe (its error message), or why it died.
std::string message_from_child(const std::function<std::string()>& work) {
  int channel[2];
  EXPECT_EQ(::pipe(channel), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(channel[0]);
    std::string text;
    try {
      text = work();
    } catch (const std::exception& e) {
      text = std::string("unexpected: ") + e.what();
    }
    (void)!::write(channel[1], text.data(), text.size());
    ::_exit(0);
  }
  ::close(channel[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t got; (got = ::read(channel[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(got));
  ::close(channel[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return text;
}

// A file system that fills up for real: a 64 kB tmpfs in a mount namespace of a child process (it vanishes
// with the child). Where mounting is not allowed, a file size limit (RLIMIT_FSIZE) gives a real EFBIG instead.
TEST(OutputPolicy, AFullFileSystemIsNamedAndLeavesNothingBehind) {
  const auto dir = temp_dir("policy-full");
  const std::string message = message_from_child([&] {
    std::string expected = "ENOSPC";
    const bool mounted = ::unshare(CLONE_NEWNS) == 0 && ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
                         ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") == 0;
    if (!mounted) {
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit limit{64 << 10, 64 << 10};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return std::string("no way to fill a file system here");
      expected = "EFBIG";
    }
    const std::string error = thrown_by([&] { write_file_atomically(dir + "/big.h5", std::string(1 << 20, 'x')); });
    std::string left;
    for (const auto& e : fs::directory_iterator(dir)) left += e.path().filename().string() + " ";
    return expected + "|" + error + "|" + left;
  });
  const auto first = message.find('|'), second = message.rfind('|');
  ASSERT_TRUE(first != std::string::npos && second != first) << message;
  const std::string expected = message.substr(0, first);
  SCOPED_TRACE(expected == "ENOSPC" ? "a full 64 kB tmpfs" : "RLIMIT_FSIZE (mounting a tmpfs is not allowed here)");
  const std::string error = message.substr(first + 1, second - first - 1);
  EXPECT_NE(error.find(dir + "/big.h5: write failed"), std::string::npos) << error;
  EXPECT_NE(error.find("(" + expected + ": "), std::string::npos) << error;
  EXPECT_EQ(message.substr(second + 1), "") << "left behind";
}

TEST(OutputPolicy, RankFilesSitBesideThePathTheUserNamed) {
  EXPECT_EQ(rank_file_path("out/report.json", 0, 1), "out/report.json");
  EXPECT_EQ(rank_file_path("out/report.json", 2, 3), "out/report.rank2.json");
  EXPECT_EQ(rank_file_path("report", 1, 2), "report.rank1");
  EXPECT_EQ(rank_file_path("/dev/null", 1, 2), "/dev/null");
}

}  // namespace
}  // namespace dp
