// Denoising checkpoints and the prompt-embedding cache (io/checkpoint_file.h, io/embeddings_cache_file.h):
// round trips, refusal of corrupt, truncated and newer files with messages that say why, keep-last-N, and a
// writer killed at random instants that never leaves a checkpoint the reader accepts and that is corrupt.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "core/error.h"
#include "io/checkpoint_file.h"
#include "io/embeddings_cache_file.h"
#include "test_support.h"

namespace dp::io {
namespace {

namespace fs = std::filesystem;

// Deterministic bytes for a checkpoint identified by `tag`: a reader can tell the expected content from the tag.
std::vector<uint8_t> pattern(size_t n, uint32_t tag) {
  std::vector<uint8_t> bytes(n);
  uint32_t x = tag * 2654435761u + 1;
  for (auto& b : bytes) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return bytes;
}

// A small valid checkpoint: 2 prompts x 2 images, `steps` steps, images at `tag % steps`.
Checkpoint sample(uint32_t tag, int64_t tokens = 64, const std::string& dtype = "bf16") {
  Checkpoint c;
  c.run.prompts = {"a cat", "a lighthouse at dusk"};
  c.run.num_images_per_prompt = 2;
  c.run.height = 64;
  c.run.width = 96;
  c.run.steps = 6;
  c.run.guidance = 3.5;
  c.run.seed = 18446744073709551615ULL;  // does not fit a double: stored as text
  c.run.max_sequence_length = 8;
  c.run.dtype = dtype;
  c.run.microbatch_size = 1;
  c.model_dir = "/models/tiny";
  c.model_fingerprint = "0123456789abcdef";
  c.device_map = "pipeline {\"\": 0}";
  c.world_size = 3;
  c.written_by = std::to_string(tag);  // lets a reader regenerate the expected content
  c.image_steps = {static_cast<int32_t>(tag % 6), static_cast<int32_t>(tag % 6) + 0, 5, 6};
  for (int i = 0; i <= 6; ++i) c.sigmas.push_back(1.0f - i / 6.0f);
  for (int i = 0; i < 6; ++i) c.timesteps.push_back(1000.0f - i * 100.0f);
  const size_t element = dtype_bytes(dtype);
  c.latents = RawTensor::owning(dtype, {4, tokens, 64}, pattern(4 * tokens * 64 * element, tag));
  c.prompt_embeds = RawTensor::owning(dtype, {4, 8, 32}, pattern(4 * 8 * 32 * element, tag + 1));
  c.pooled = RawTensor::owning(dtype, {4, 16}, pattern(4 * 16 * element, tag + 2));
  return c;
}

bool same_bytes(const RawTensor& a, const RawTensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes && std::memcmp(a.data, b.data, a.nbytes) == 0;
}

void expect_same(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.run.prompts, b.run.prompts);
  EXPECT_EQ(a.run.seed, b.run.seed);
  EXPECT_EQ(a.run.steps, b.run.steps);
  EXPECT_EQ(a.run.dtype, b.run.dtype);
  EXPECT_EQ(a.image_steps, b.image_steps);
  EXPECT_EQ(a.sigmas, b.sigmas);
  EXPECT_EQ(a.timesteps, b.timesteps);
  EXPECT_EQ(a.model_fingerprint, b.model_fingerprint);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_TRUE(same_bytes(a.latents, b.latents));
  EXPECT_TRUE(same_bytes(a.prompt_embeds, b.prompt_embeds));
  EXPECT_TRUE(same_bytes(a.pooled, b.pooled));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Checkpoint, RoundTripsEveryField) {
  const auto dir = dp::test::temp_dir("ckpt");
  for (const char* dtype : {"fp32", "bf16", "fp16"}) {
    const Checkpoint c = sample(7, 16, dtype);
    write_checkpoint(dir + "/a.h5", c);
    const Checkpoint back = read_checkpoint(dir + "/a.h5");
    expect_same(c, back);
    EXPECT_EQ(back.steps_done(), 1);
    EXPECT_FALSE(back.finished());
  }
  // No temporary is left beside it.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(Checkpoint, RefusesCorruptTruncatedAndNewerFilesNamingWhy) {
  const auto dir = dp::test::temp_dir("ckpt-bad");
  const std::string good = dir + "/good.h5";
  write_checkpoint(good, sample(3, 256));
  const std::string bytes = dp::test::read_file(good);

  // A flipped byte in the middle of the latents' data: HDF5 opens it, the digest refuses it.
  std::string flipped = bytes;
  const size_t at = flipped.find(std::string(reinterpret_cast<const char*>(sample(3, 256).latents.data) + 1000, 16));
  ASSERT_NE(at, std::string::npos);
  flipped[at + 3] = static_cast<char>(flipped[at + 3] ^ 0x40);
  dp::test::write_file(dir + "/flipped.h5", flipped);
  EXPECT_NE(error_of([&] { read_checkpoint(dir + "/flipped.h5"); }).find("content digest mismatch"), std::string::npos);

  // Truncated anywhere: refused, never accepted.
  for (size_t keep : {size_t(0), size_t(100), bytes.size() / 3, bytes.size() / 2, bytes.size() - 100}) {
    dp::test::write_file(dir + "/cut.h5", bytes.substr(0, keep));
    const std::string why = error_of([&] { read_checkpoint(dir + "/cut.h5"); });
    EXPECT_NE(why, "(no error)") << "truncated to " << keep << " bytes";
    EXPECT_NE(why.find("cut.h5"), std::string::npos) << why;
  }

  // Written by a newer diffpipe.
  Checkpoint newer = sample(3);
  newer.format_version = kCheckpointFormatVersion + 1;
  write_checkpoint(dir + "/newer.h5", newer);
  EXPECT_NE(error_of([&] { read_checkpoint(dir + "/newer.h5"); })
                .find(str("format version ", kCheckpointFormatVersion + 1, " was written by a newer diffpipe")),
            std::string::npos);

  // Not a checkpoint at all.
  dp::test::write_file(dir + "/text.h5", "hello");
  EXPECT_NE(error_of([&] { read_checkpoint(dir + "/text.h5"); }).find("not an HDF5 file"), std::string::npos);
  EXPECT_NE(error_of([&] { read_checkpoint(dir + "/absent.h5"); }).find("no such checkpoint file"), std::string::npos);
}

TEST(Checkpoint, ComparesOnlyTheOptionsGivenAndNamesEachDifference) {
  const CheckpointRun a = sample(1).run;
  CheckpointRun b = a;
  b.steps = 9;
  b.height = 128;
  b.dtype = "fp32";
  EXPECT_TRUE(compare_runs(a, b, {}).empty());
  const auto d = compare_runs(a, b, {"steps", "height", "width", "dtype"});
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].field, "height");
  EXPECT_EQ(d[0].in_checkpoint, "64");
  EXPECT_EQ(d[0].in_run, "128");
  EXPECT_EQ(d[1].field, "steps");
  EXPECT_EQ(d[2].field, "dtype");
}

TEST(Checkpoint, KeepsTheNewestNAndResumesFromTheNewestValid) {
  const auto dir = dp::test::temp_dir("ckpt-keep");
  for (int step = 1; step <= 5; ++step) {
    write_checkpoint(dir + "/" + checkpoint_file_name(step), sample(static_cast<uint32_t>(step)));
    prune_checkpoints(dir, 2);
  }
  const auto kept = list_checkpoints(dir);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(fs::path(kept[0]).filename(), "checkpoint-step000004.h5");
  EXPECT_EQ(fs::path(kept[1]).filename(), "checkpoint-step000005.h5");
  EXPECT_EQ(newest_valid_checkpoint(dir), kept[1]);
  // The newest damaged: the one before it.
  const std::string bytes = dp::test::read_file(kept[1]);
  dp::test::write_file(kept[1], bytes.substr(0, bytes.size() / 2));
  EXPECT_EQ(newest_valid_checkpoint(dir), kept[0]);
  dp::test::write_file(kept[0], "junk");
  EXPECT_NE(error_of([&] { newest_valid_checkpoint(dir); }).find("no valid checkpoint"), std::string::npos);
}

// The writer killed with SIGKILL at random instants, >= 200 times: every file a reader accepts, under the
// final name or a leftover temporary, holds exactly what one complete write put there.
TEST(Checkpoint, AWriterKilledAtRandomInstantsNeverLeavesAnAcceptedCorruptFile) {
  const auto dir = dp::test::temp_dir("ckpt-kill");
  std::mt19937 random(12345);
  int accepted = 0, refused = 0, kills = 0;
  uint32_t tag = 0;
  for (int round = 0; round < 220; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // Keeps rewriting the same checkpoint name with new contents (each tag different) until killed.
      for (uint32_t t = tag;; ++t) {
        try {
          write_checkpoint(dir + "/" + checkpoint_file_name(1), sample(t, 512));
        } catch (...) {
          ::_exit(3);
        }
      }
    }
    tag += 100000;
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 20000)(random)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended by itself (status " << status << ")";
    ++kills;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string path = entry.path().string();
      try {
        const Checkpoint c = read_checkpoint(path);
        // Accepted: it must be exactly one complete write, the one its tag names.
        expect_same(sample(static_cast<uint32_t>(std::stoul(c.written_by)), 512), c);
        ++accepted;
        // A temporary that a kill left complete but unrenamed is harmless (hidden, never resumed from).
        if (entry.path().filename().string().rfind(".", 0) == 0) fs::remove(path);
      } catch (const Error&) {
        ++refused;
        // Only temporaries may be refused: the final name always holds a complete checkpoint once one exists.
        EXPECT_NE(entry.path().filename().string().rfind(".", 0), std::string::npos)
            << "the final name holds a refused file: " << path;
        fs::remove(path);
      }
    }
  }
  std::cout << kills << " writers killed: " << accepted << " files accepted (all complete), " << refused
            << " partial temporaries refused\n";
  // The next prune removes what killed writers left behind.
  prune_checkpoints(dir, 1);
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename(), checkpoint_file_name(1)) << "left behind: " << entry.path();
  EXPECT_GE(kills, 200);
  EXPECT_GT(accepted, 0);
}

TEST(EmbeddingsCache, RoundTripsAndSkipsDamagedEntries) {
  const auto dir = dp::test::temp_dir("embcache");
  const std::string path = dir + "/cache.h5";
  EXPECT_TRUE(read_embeddings_cache(path).empty());
  std::map<std::string, CachedEmbedding> entries;
  for (uint32_t i = 0; i < 3; ++i) {
    CachedEmbedding e;
    e.prompt = "prompt " + std::to_string(i);
    e.max_sequence_length = 8;
    e.dtype = "fp32";
    e.encoder_fingerprint = "abc";
    e.prompt_embeds = RawTensor::owning("fp32", {1, 8, 4}, pattern(8 * 4 * 4, i));
    e.pooled = RawTensor::owning("fp32", {1, 6}, pattern(6 * 4, i + 10));
    entries[embedding_cache_key(e.prompt, 8, "fp32", "abc")] = e;
  }
  write_embeddings_cache(path, entries);
  const auto back = read_embeddings_cache(path);
  ASSERT_EQ(back.size(), 3u);
  for (const auto& [key, e] : entries) {
    ASSERT_TRUE(back.count(key));
    EXPECT_EQ(back.at(key).prompt, e.prompt);
    EXPECT_TRUE(same_bytes(back.at(key).prompt_embeds, e.prompt_embeds));
    EXPECT_TRUE(same_bytes(back.at(key).pooled, e.pooled));
  }
  // The key depends on each part.
  EXPECT_NE(embedding_cache_key("p", 8, "fp32", "abc"), embedding_cache_key("p", 16, "fp32", "abc"));
  EXPECT_NE(embedding_cache_key("p", 8, "fp32", "abc"), embedding_cache_key("p", 8, "bf16", "abc"));
  EXPECT_NE(embedding_cache_key("p", 8, "fp32", "abc"), embedding_cache_key("p", 8, "fp32", "abd"));
  // A damaged file is an empty cache, not an error.
  dp::test::write_file(path, "junk");
  EXPECT_TRUE(read_embeddings_cache(path).empty());
}

}  // namespace
}  // namespace dp::io
