// What `diffpipe generate` writes, and what it never touches (issue 21), run as a user would: links, FIFOs,
// colliding paths, a file named as the embeddings cache that is not one, a bad --report path and a bad
// --transport-timeout are each refused in one line before any work, and every file that was there before is
// left as it was.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include "test_support.h"

namespace fs = std::filesystem;

namespace dp::cli {
namespace {

std::string tiny_pipe() { return dp::test::reference_dir() + "/pipeline/schnell_like/pipe"; }

const std::string kSmall = " --prompt cat --height 32 --width 32 ";

dp::test::CommandResult generate(const std::string& args, const std::string& steps = "1") {
  return dp::test::run_command(dp::test::diffpipe_binary() + " generate --model " + tiny_pipe() + kSmall + "--steps " +
                               steps + " " + args);
}

// Every entry of `dir` (recursively, links not followed) with what it is and holds: a run that was refused
// must leave this exactly as it was.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string path = e.path().string();
    struct stat st {};
    ::lstat(path.c_str(), &st);
    std::string what;
    if (S_ISLNK(st.st_mode)) what = "link to " + fs::read_symlink(e.path()).string();
    else if (S_ISREG(st.st_mode)) what = "file " + dp::test::read_file(path);
    else if (S_ISDIR(st.st_mode)) what = "dir";
    else what = "special " + std::to_string(st.st_mode);
    out[path] = what;
  }
  return out;
}

// One line naming `message`, exit 3 (an input error), no stage started, nothing in `dir` changed.
void expect_refused(const dp::test::CommandResult& r, const std::string& message,
                    const std::map<std::string, std::string>& before, const std::string& dir) {
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("stage "), std::string::npos) << "work started before the error:\n" << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_EQ(snapshot(dir), before) << r.output;
}

// Case 2: writers followed symlinks and replaced what they pointed at.
TEST(GenerateFiles, NoOutputIsWrittenThroughASymbolicLink) {
  const auto dir = dp::test::temp_dir("files-link");
  dp::test::write_file(dir + "/precious.txt", "precious");
  fs::create_symlink(dir + "/precious.txt", dir + "/out.png");
  fs::create_symlink(dir + "/precious.txt", dir + "/two-1.png");  // a name --out two.png derives
  fs::create_symlink(dir + "/precious.txt", dir + "/report.json");
  fs::create_directory(dir + "/real");
  fs::create_directory_symlink(dir + "/real", dir + "/linked-folder");
  const auto before = snapshot(dir);
  expect_refused(generate("--out " + dir + "/out.png"), "--out " + dir + "/out.png: is a symbolic link", before, dir);
  expect_refused(generate("--num-images-per-prompt 2 --out " + dir + "/two.png"),
                 dir + "/two-1.png: is a symbolic link", before, dir);
  expect_refused(generate("--out " + dir + "/x.png --report-json " + dir + "/report.json"),
                 "--report-json " + dir + "/report.json: is a symbolic link", before, dir);
  expect_refused(generate("--out " + dir + "/x.png --report " + dir + "/report.json"), "--report " + dir +
                 "/report.json: is a symbolic link", before, dir);
  // A linked folder on the way is fine.
  const auto ok = generate("--out " + dir + "/linked-folder/x.png");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(fs::is_regular_file(dir + "/real/x.png"));
  EXPECT_EQ(dp::test::read_file(dir + "/precious.txt"), "precious");
}

// Case 4: --embeddings-cache pointed at a prompts file, a text file or a latents file rewrote it.
TEST(GenerateFiles, TheEmbeddingsCacheOverwritesOnlyACache) {
  const auto dir = dp::test::temp_dir("files-cache");
  dp::test::write_file(dir + "/prompts.txt", "a cat\n");
  dp::test::write_file(dir + "/notes.txt", "notes");
  const auto latents = generate("--output-type latent --out " + dir + "/latents.h5");
  ASSERT_EQ(latents.exit_code, 0) << latents.output;
  const auto before = snapshot(dir);
  expect_refused(generate("--prompts-file " + dir + "/notes.txt --out " + dir + "/x.png --embeddings-cache " + dir +
                          "/prompts.txt"),
                 "--embeddings-cache " + dir + "/prompts.txt: exists and is not an HDF5 file", before, dir);
  expect_refused(generate("--out " + dir + "/x.png --embeddings-cache " + dir + "/latents.h5"),
                 "is an HDF5 file holding latents, not a diffpipe embeddings cache", before, dir);
  // A new cache is written, and the next run takes it as its own.
  for (int round = 0; round < 2; ++round) {
    const auto run = generate("--out " + dir + "/x.png --embeddings-cache " + dir + "/cache.h5");
    EXPECT_EQ(run.exit_code, 0) << run.output;
  }
}

// Case 5: colliding outputs.
TEST(GenerateFiles, OneFileUnderTwoOptionsIsRefusedBeforeAnyWork) {
  const auto dir = dp::test::temp_dir("files-collide");
  // A checkpoint to resume from (the run ends at step 2 of 2: its checkpoint of step 1 stays).
  const auto first = generate("--output-type latent --out " + dir + "/first.h5 --checkpoint-dir " + dir +
                              "/ck --checkpoint-every 1", "2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::string checkpoint;
  for (const auto& e : fs::directory_iterator(dir + "/ck")) checkpoint = e.path().string();
  ASSERT_FALSE(checkpoint.empty());
  dp::test::write_file(dir + "/prompts.txt", "a dog\n");
  fs::create_hard_link(dir + "/prompts.txt", dir + "/hard.json");
  const auto before = snapshot(dir);
  expect_refused(generate("--out " + dir + "/x.png --report-json " + dir + "/x.png"),
                 "--out " + dir + "/x.png and --report-json " + dir + "/x.png are the same file", before, dir);
  expect_refused(dp::test::run_command(dp::test::diffpipe_binary() + " generate --model " + tiny_pipe() +
                                       " --output-type latent --resume " + checkpoint + " --out " + checkpoint),
                 "--out " + checkpoint + " and --resume " + checkpoint + " are the same file", before, dir);
  expect_refused(generate("--output-type latent --out " + dir + "/c.h5 --embeddings-cache " + dir + "/./c.h5"),
                 "and --embeddings-cache " + dir + "/./c.h5 are the same file", before, dir);
  expect_refused(generate("--prompts-file " + dir + "/prompts.txt --out " + dir + "/x.png --report-json " + dir +
                          "/hard.json"),
                 "one inode under two names", before, dir);
  expect_refused(generate("--out " + tiny_pipe() + "/x.png"), "is inside --model", before, dir);
  expect_refused(generate("--out " + dir + "/y.png --report " + dir + "/y.png"), "are the same file", before, dir);
}

// Case 6: a FIFO as --out hung after all the work (for ever on one rank).
TEST(GenerateFiles, AFifoAsOutputIsRefusedInsteadOfHanging) {
  const auto dir = dp::test::temp_dir("files-fifo");
  ASSERT_EQ(::mkfifo((dir + "/pipe.png").c_str(), 0600), 0);
  const auto before = snapshot(dir);
  const auto started = std::chrono::steady_clock::now();
  expect_refused(generate("--out " + dir + "/pipe.png"), "is a FIFO (named pipe); diffpipe writes only regular files",
                 before, dir);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 30);
}

// Case 8: a bad --report path failed after the whole run; --transport-timeout 0, negative or nan was accepted.
TEST(GenerateFiles, EveryPathAndTheTimeoutAreCheckedAtStart) {
  const auto dir = dp::test::temp_dir("files-late");
  fs::create_directory(dir + "/folder");
  const auto before = snapshot(dir);
  expect_refused(generate("--out " + dir + "/x.png --report " + dir + "/missing/r.json"),
                 "--report " + dir + "/missing/r.json: directory " + dir + "/missing does not exist", before, dir);
  expect_refused(generate("--out " + dir + "/x.png --report " + dir + "/folder"), "is a directory", before, dir);
  for (const std::string value : {"0", "-5", "nan", "inf"})
    expect_refused(generate("--out " + dir + "/x.png --transport-timeout " + value),
                   "--transport-timeout " + value + ": expected a positive, finite number of seconds", before, dir);
}

}  // namespace
}  // namespace dp::cli
