// Denoising checkpoints and the prompt-embedding cache (io/checkpoint_file.h, io/checkpoint_dir.h,
// io/embeddings_cache_file.h): round trips, refusal of corrupt, truncated and newer files with messages that say
// why, version 1 files still read, a folder shared by runs (rotation and --resume per run, a foreign folder
// refused), a cache that only overwrites a cache, and a writer killed at random instants that never leaves a
// checkpoint the reader accepts and that is corrupt.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "core/error.h"
#include "io/checkpoint_dir.h"
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

constexpr const char* kRunA = "0123456789abcdef";
constexpr const char* kRunB = "fedcba9876543210";

// A small valid checkpoint of run `run_id`: 2 prompts x 2 images, `steps` steps, images at `tag % steps`.
Checkpoint sample(uint32_t tag, int64_t tokens = 64, const std::string& dtype = "bf16",
                  const std::string& run_id = kRunA) {
  Checkpoint c;
  c.run_id = run_id;
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
  EXPECT_EQ(a.run_id, b.run_id);
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

// A run with negative prompts, custom sigmas, initial latents and adapters writes format version 3; its header
// (what --resume DIR lists) carries those options too, so its request fingerprint checks out, and differs from
// the same run without them.
TEST(Checkpoint, VersionThreeOptionsBelongToTheRequest) {
  const auto dir = dp::test::temp_dir("ckpt-v3");
  Checkpoint c = sample(3);
  const Checkpoint plain = c;
  c.run.negative_prompts = {"blurry"};
  c.run.true_cfg_scale = 2.0;
  c.run.custom_sigmas = {1.0, 0.8, 0.6, 0.4, 0.2, 0.1};
  c.run.initial_latents = "start.h5 0123";
  c.run.lora = R"({"mode":"fused"})";
  c.negative_prompt_embeds = RawTensor::owning("bf16", {4, 8, 32}, pattern(4 * 8 * 32 * 2, 7));
  c.negative_pooled = RawTensor::owning("bf16", {4, 16}, pattern(4 * 16 * 2, 8));
  write_checkpoint(dir + "/v3.h5", c);
  const Checkpoint header = read_checkpoint_header(dir + "/v3.h5");
  EXPECT_EQ(header.format_version, 3);
  EXPECT_EQ(header.run.custom_sigmas, c.run.custom_sigmas);
  EXPECT_EQ(header.run.negative_prompts, c.run.negative_prompts);
  EXPECT_EQ(header.request_fingerprint, request_fingerprint(c.run));
  EXPECT_NE(header.request_fingerprint, request_fingerprint(plain.run));
  const Checkpoint back = read_checkpoint(dir + "/v3.h5");
  EXPECT_TRUE(same_bytes(back.negative_prompt_embeds, c.negative_prompt_embeds));
  EXPECT_EQ(back.run.lora, c.run.lora);
  write_checkpoint(dir + "/v2.h5", plain);
  EXPECT_EQ(read_checkpoint_header(dir + "/v2.h5").format_version, 2);
}

// --fp8-gemms is recorded (format version 3, its own attribute), belongs to the request's fingerprint and is
// compared when given; a value this build does not know is refused, naming it.
TEST(Checkpoint, Fp8GemmsAreRecordedAndCompared) {
  const auto dir = dp::test::temp_dir("ckpt-fp8");
  Checkpoint c = sample(4);
  const Checkpoint plain = c;
  c.run.transformer_gemms = "fp8";
  write_checkpoint(dir + "/fp8.h5", c);
  const Checkpoint back = read_checkpoint(dir + "/fp8.h5");
  EXPECT_EQ(back.format_version, 3);
  EXPECT_EQ(back.run.transformer_gemms, "fp8");
  EXPECT_EQ(back.request_fingerprint, request_fingerprint(c.run));
  EXPECT_NE(request_fingerprint(c.run), request_fingerprint(plain.run));
  write_checkpoint(dir + "/plain.h5", plain);
  EXPECT_EQ(read_checkpoint(dir + "/plain.h5").run.transformer_gemms, "");
  EXPECT_TRUE(compare_runs(c.run, plain.run, {}).empty());
  const auto d = compare_runs(plain.run, c.run, {"fp8-gemms"});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].field, "fp8-gemms");
  EXPECT_EQ(d[0].in_checkpoint, "off");
  EXPECT_EQ(d[0].in_run, "on");
  Checkpoint unknown = c;
  unknown.run.transformer_gemms = "int4";
  write_checkpoint(dir + "/unknown.h5", unknown);
  EXPECT_NE(error_of([&] { read_checkpoint(dir + "/unknown.h5"); }).find("transformer_gemms is 'int4'"),
            std::string::npos);
  // --resume DIR picks by it when given, and lists it when it refuses.
  const std::string folder = dir + "/runs";
  fs::create_directory(folder);
  write_checkpoint(folder + "/" + checkpoint_file_name(1, kRunA), c);
  Checkpoint other = plain;
  other.run_id = kRunB;
  write_checkpoint(folder + "/" + checkpoint_file_name(1, kRunB), other);
  ResumeRequest request;
  request.model_fingerprint = c.model_fingerprint;
  request.run = c.run;
  request.given = {"fp8-gemms"};
  EXPECT_EQ(select_resume_checkpoint(folder, request), folder + "/" + checkpoint_file_name(1, kRunA));
  request.given = {};
  const std::string why = error_of([&] { select_resume_checkpoint(folder, request); });
  EXPECT_NE(why.find(std::string("run ") + kRunA), std::string::npos) << why;
  EXPECT_NE(why.find("bf16 with --fp8-gemms"), std::string::npos) << why;
}

TEST(Checkpoint, RoundTripsEveryField) {
  const auto dir = dp::test::temp_dir("ckpt");
  for (const char* dtype : {"fp32", "bf16", "fp16"}) {
    const Checkpoint c = sample(7, 16, dtype);
    write_checkpoint(dir + "/a.h5", c);
    const Checkpoint back = read_checkpoint(dir + "/a.h5");
    expect_same(c, back);
    EXPECT_EQ(back.format_version, 2);
    EXPECT_EQ(back.request_fingerprint, request_fingerprint(c.run));
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

TEST(Checkpoint, Version1FilesWithoutARunIdAreStillRead) {
  const auto dir = dp::test::temp_dir("ckpt-v1");
  Checkpoint old = sample(2);
  old.format_version = 1;
  old.run_id.clear();
  write_checkpoint(dir + "/old.h5", old);
  const Checkpoint back = read_checkpoint(dir + "/old.h5");
  EXPECT_EQ(back.format_version, 1);
  EXPECT_EQ(back.run_id, "");
  EXPECT_EQ(back.request_fingerprint, request_fingerprint(old.run));  // computed from its attributes
  expect_same(old, back);
  // A file an older diffpipe wrote (the fuzz corpus' seed, format version 1).
  const Checkpoint corpus = read_checkpoint(dp::test::source_dir() + "/tests/fuzz/corpus/checkpoint/valid_fp32");
  EXPECT_EQ(corpus.format_version, 1);
  EXPECT_EQ(corpus.run_id, "");
  // A run id is part of every newer file, and a request fingerprint that disagrees with the options is refused.
  Checkpoint no_id = sample(2);
  no_id.run_id = "not-hex";
  EXPECT_NE(error_of([&] { write_checkpoint(dir + "/x.h5", no_id); }).find("needs a run id"), std::string::npos);
}

// A folder two runs (A, B) and an older diffpipe (version 1) wrote into, with a link planted under a checkpoint
// name and the temporaries of killed writers.
struct SharedFolder {
  std::string dir = dp::test::temp_dir("ckpt-shared");
  std::string victim = dp::test::temp_dir("ckpt-victim") + "/precious.txt";
  SharedFolder() {
    for (int step = 1; step <= 4; ++step) {
      write_checkpoint(dir + "/" + checkpoint_file_name(step, kRunA), sample(static_cast<uint32_t>(step), 64, "bf16", kRunA));
      Checkpoint b = sample(static_cast<uint32_t>(step) + 10, 64, "bf16", kRunB);
      b.run.seed = 7;  // another request
      write_checkpoint(dir + "/" + checkpoint_file_name(step, kRunB), b);
    }
    Checkpoint old = sample(3);
    old.format_version = 1;
    old.run_id.clear();
    old.run.steps = 6;
    old.run.prompts = {"an old prompt", "another"};
    write_checkpoint(dir + "/checkpoint-step000005.h5", old);
    dp::test::write_file(victim, "precious");
    fs::create_symlink(victim, dir + "/" + checkpoint_file_name(9, kRunA));
    dp::test::write_file(dir + "/.checkpoint-step000005-" + std::string(kRunA) + ".h5.abcdef.partial", "half");
    dp::test::write_file(dir + "/.checkpoint-step000005-" + std::string(kRunB) + ".h5.abcdef.partial", "half");
    dp::test::write_file(dir + "/notes.txt", "the user's");
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST(CheckpointDir, RotationRemovesOnlyThisRunsOlderFiles) {
  SharedFolder folder;
  const auto removed = prune_run_checkpoints(folder.dir, kRunA, 2);
  ASSERT_EQ(removed.size(), 3u);  // steps 1 and 2 of run A, and run A's temporary
  const auto names = folder.names();
  for (int step : {1, 2}) EXPECT_EQ(std::count(names.begin(), names.end(), checkpoint_file_name(step, kRunA)), 0);
  for (int step : {3, 4}) EXPECT_EQ(std::count(names.begin(), names.end(), checkpoint_file_name(step, kRunA)), 1);
  // Run B's files, the version 1 file, the link (and what it points at), B's temporary and the user's file.
  for (int step = 1; step <= 4; ++step)
    EXPECT_EQ(std::count(names.begin(), names.end(), checkpoint_file_name(step, kRunB)), 1) << step;
  for (const std::string& kept : std::vector<std::string>{"checkpoint-step000005.h5", checkpoint_file_name(9, kRunA),
                                                          "notes.txt", ".checkpoint-step000005-" + std::string(kRunB) +
                                                                           ".h5.abcdef.partial"})
    EXPECT_EQ(std::count(names.begin(), names.end(), kept), 1) << kept;
  EXPECT_EQ(dp::test::read_file(folder.victim), "precious");
  EXPECT_TRUE(fs::is_symlink(folder.dir + "/" + checkpoint_file_name(9, kRunA)));
}

TEST(CheckpointDir, ResumeTakesTheNewestValidCheckpointOfTheOneMatchingRun) {
  SharedFolder folder;
  ResumeRequest request;
  request.model_fingerprint = "0123456789abcdef";
  request.run = sample(0).run;
  // Nothing given: runs A, B and the version 1 run all match; each is named.
  std::string why = error_of([&] { select_resume_checkpoint(folder.dir, request); });
  EXPECT_NE(why.find("holds checkpoints of 3 runs that this request matches"), std::string::npos) << why;
  EXPECT_NE(why.find(std::string("run ") + kRunA + ": steps 1, 2, 3, 4"), std::string::npos) << why;
  EXPECT_NE(why.find(std::string("run ") + kRunB), std::string::npos) << why;
  EXPECT_NE(why.find("format version 1 (no run id)"), std::string::npos) << why;
  // The seed and the prompts single run A out; the link under its name is never read.
  request.given = {"seed", "prompts"};
  EXPECT_EQ(select_resume_checkpoint(folder.dir, request), folder.dir + "/" + checkpoint_file_name(4, kRunA));
  request.run.seed = 7;
  EXPECT_EQ(select_resume_checkpoint(folder.dir, request), folder.dir + "/" + checkpoint_file_name(4, kRunB));
  // Run A's newest damaged: its previous one, never run B's.
  request.run.seed = sample(0).run.seed;
  const std::string newest = folder.dir + "/" + checkpoint_file_name(4, kRunA);
  const std::string bytes = dp::test::read_file(newest);
  dp::test::write_file(newest, bytes.substr(0, bytes.size() / 2));
  EXPECT_EQ(select_resume_checkpoint(folder.dir, request), folder.dir + "/" + checkpoint_file_name(3, kRunA));
  // Another model: none of the runs matches, and each is named with what differs.
  request.model_fingerprint = "ffffffffffffffff";
  why = error_of([&] { select_resume_checkpoint(folder.dir, request); });
  EXPECT_NE(why.find("none matches this request"), std::string::npos) << why;
  EXPECT_NE(why.find("differs: another model"), std::string::npos) << why;
  // One run alone is taken even when it differs: the caller's comparison names the difference.
  const auto single = dp::test::temp_dir("ckpt-single");
  write_checkpoint(single + "/" + checkpoint_file_name(2, kRunA), sample(2));
  EXPECT_EQ(select_resume_checkpoint(single, request), single + "/" + checkpoint_file_name(2, kRunA));
  const auto empty = dp::test::temp_dir("ckpt-empty");
  EXPECT_NE(error_of([&] { select_resume_checkpoint(empty, request); }).find("no valid checkpoint"), std::string::npos);
}

TEST(CheckpointDir, AFolderHoldingAnotherRunsFilesIsRefusedUnlessShared) {
  SharedFolder folder;
  const std::string why = error_of([&] { check_checkpoint_dir_for_run(folder.dir, "1111111111111111", false); });
  EXPECT_NE(why.find("holds checkpoints of another run"), std::string::npos) << why;
  EXPECT_NE(why.find(std::string("run ") + kRunB), std::string::npos) << why;
  EXPECT_NE(why.find("a symbolic link"), std::string::npos) << why;
  EXPECT_NE(why.find("--share-checkpoint-dir"), std::string::npos) << why;
  check_checkpoint_dir_for_run(folder.dir, "1111111111111111", true);
  // Its own files (a resumed run), the user's files and temporaries do not count.
  const auto own = dp::test::temp_dir("ckpt-own");
  write_checkpoint(own + "/" + checkpoint_file_name(2, kRunA), sample(2));
  dp::test::write_file(own + "/notes.txt", "x");
  dp::test::write_file(own + "/.checkpoint-step000003-" + std::string(kRunB) + ".h5.abcdef.partial", "half");
  check_checkpoint_dir_for_run(own, kRunA, false);
  EXPECT_NE(error_of([&] { check_checkpoint_dir_for_run(own, kRunB, false); }).find("another run"), std::string::npos);
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
          write_checkpoint(dir + "/" + checkpoint_file_name(1, kRunA), sample(t, 512));
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
  // The next prune removes what killed writers of this run left behind.
  prune_run_checkpoints(dir, kRunA, 1);
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename(), checkpoint_file_name(1, kRunA)) << "left behind: " << entry.path();
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
  EXPECT_NO_THROW(check_embeddings_cache_target(path));
}

TEST(EmbeddingsCache, OnlyACacheIsEverOverwritten) {
  const auto dir = dp::test::temp_dir("embcache-refuse");
  const std::map<std::string, CachedEmbedding> none;
  // A prompts file, an empty file, a checkpoint named by mistake: refused, left as they were.
  dp::test::write_file(dir + "/prompts.txt", "a cat\n");
  dp::test::write_file(dir + "/empty.h5", "");
  write_checkpoint(dir + "/checkpoint.h5", sample(1));
  const std::string checkpoint_bytes = dp::test::read_file(dir + "/checkpoint.h5");
  for (const auto& [name, what] : std::vector<std::pair<std::string, std::string>>{
           {"prompts.txt", "not an HDF5 file"}, {"empty.h5", "empty"}, {"checkpoint.h5", "format 'diffpipe-checkpoint'"}}) {
    const std::string path = dir + "/" + name;
    EXPECT_NE(error_of([&] { check_embeddings_cache_target(path); }).find(what), std::string::npos) << name;
    EXPECT_NE(error_of([&] { write_embeddings_cache(path, none); }).find("not a diffpipe embeddings cache"),
              std::string::npos) << name;
    EXPECT_NE(error_of([&] { read_embeddings_cache(path); }).find("not a diffpipe embeddings cache"),
              std::string::npos) << name;
  }
  EXPECT_EQ(dp::test::read_file(dir + "/prompts.txt"), "a cat\n");
  EXPECT_EQ(dp::test::read_file(dir + "/checkpoint.h5"), checkpoint_bytes);
  // A new file, and a cache diffpipe wrote, are fine.
  write_embeddings_cache(dir + "/new.h5", none);
  check_embeddings_cache_target(dir + "/new.h5");
  write_embeddings_cache(dir + "/new.h5", none);
}

}  // namespace
}  // namespace dp::io
