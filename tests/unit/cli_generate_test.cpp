// `diffpipe generate` against bad requests, run as a user would: every one fails with one clear line and a
// non-zero exit before any work where it can be known up front, leaves no file behind (no output, no
// .partial), and never ends in std::terminate or a C++ backtrace.
#include <ATen/Context.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <thread>

#include "core/exit_codes.h"
#include "core/json_file.h"
#include "io/hdf5_latents.h"
#include "io/safetensors.h"
#include "io/torch_tensors.h"
#include "core/exit_codes.h"
#include "test_support.h"

namespace fs = std::filesystem;

namespace dp::cli {
namespace {

std::string tiny_pipe() { return dp::test::reference_dir() + "/pipeline/schnell_like/pipe"; }
std::string tiny_dev_pipe() { return dp::test::reference_dir() + "/pipeline/dev_like/pipe"; }

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> partial_files_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& name : entries_of(dir))
    if (name.find(".partial") != std::string::npos) found.push_back(name);
  return found;
}

size_t line_count(const std::string& text) { return static_cast<size_t>(std::count(text.begin(), text.end(), '\n')); }

struct Timed {
  dp::test::CommandResult result;
  double seconds = 0;
};

// `generate` with a small, fast request on the tiny pipeline plus `args` (later flags win in CLI11 only for
// scalars, so tests pass what they vary explicitly).
Timed generate(const std::string& args, const std::string& prefix = "") {
  const auto started = std::chrono::steady_clock::now();
  Timed run;
  run.result = dp::test::run_command(prefix + dp::test::diffpipe_binary() + " generate " + args);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return run;
}

const std::string kSmall = " --height 32 --width 32 --steps 1 ";

// The failures every bad request must share: the input error's exit status (3; 2 for a command line that cannot
// be parsed, core/exit_codes.h), one line of diagnosis containing `message`, no stage started (nothing was
// loaded), nothing left in `dir`.
void expect_refused_up_front(const Timed& run, const std::string& message, const std::string& dir,
                             const std::vector<std::string>& entries_before = {}, int exit_code = dp::kExitInputError) {
  const auto& r = run.result;
  EXPECT_EQ(r.exit_code, exit_code) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("stage "), std::string::npos) << "work started before the error:\n" << r.output;
  EXPECT_EQ(line_count(r.output), 1u) << r.output;
  EXPECT_EQ(entries_of(dir), entries_before) << r.output;
}

// Named without "Cuda" so that bench/gpu_check.sh, which runs every test so named on the GPU, leaves it out.
TEST(GenerateCommand, GpuDeviceOnAMachineWithoutOneIsRefusedInOneLine) {
  if (at::hasCUDA()) GTEST_SKIP() << "CUDA works here";
  const auto dir = dp::test::temp_dir("gen-cuda");
  const Timed run = generate("--model " + tiny_pipe() + " --prompt cat --device cuda --out " + dir + "/x.png" + kSmall);
  expect_refused_up_front(run, "--device cuda: CUDA cannot be used here", dir);
  EXPECT_NE(run.result.output.find("--device cpu"), std::string::npos) << run.result.output;
  EXPECT_EQ(run.result.output.find("frame #"), std::string::npos) << run.result.output;
}

TEST(GenerateCommand, TorchErrorsAreOneLineWithTheBacktraceAtDebugLevel) {
  // forward with inputs of the wrong width: LibTorch's matmul refuses them with a c10::Error.
  const auto dir = dp::test::temp_dir("gen-c10");
  io::save_tensors(dir + "/inputs.safetensors", {{"input.hidden_states", at::zeros({1, 4, 7})},
                                                 {"input.encoder_hidden_states", at::zeros({1, 3, 32})},
                                                 {"input.pooled_projections", at::zeros({1, 32})},
                                                 {"input.timestep", at::ones({1})},
                                                 {"input.img_ids", at::zeros({4, 3})},
                                                 {"input.txt_ids", at::zeros({3, 3})}});
  const std::string command = dp::test::diffpipe_binary() + " forward --model " + tiny_pipe() + " --inputs " + dir +
                              "/inputs.safetensors --repeat 1 --warmup 0";
  const auto plain = dp::test::run_command(command);
  EXPECT_EQ(plain.exit_code, 1) << plain.output;
  const auto error_line = plain.output.substr(plain.output.find("diffpipe: error:"));
  EXPECT_NE(error_line.find("LibTorch: "), std::string::npos) << plain.output;
  EXPECT_EQ(line_count(error_line), 1u) << plain.output;
  EXPECT_EQ(plain.output.find("frame #"), std::string::npos) << plain.output;
  const auto debug = dp::test::run_command(command + " --log-level debug");
  EXPECT_EQ(debug.exit_code, 1) << debug.output;
  EXPECT_NE(debug.output.find("LibTorch error in full"), std::string::npos) << debug.output;
}

TEST(GenerateCommand, OutputPathsAreCheckedBeforeAnyWork) {
  const auto dir = dp::test::temp_dir("gen-out");
  fs::create_directory(dir + "/folder");
  const std::string base = "--model " + tiny_pipe() + " --prompt cat" + kSmall;
  // An existing directory used to fail after the whole run and leave folder.partial behind.
  expect_refused_up_front(generate(base + "--out " + dir + "/folder"), "is a directory", dir, {"folder"});
  expect_refused_up_front(generate(base + "--out " + dir + "/missing/x.png"), "does not exist", dir, {"folder"});
  expect_refused_up_front(generate(base + "--out /proc/diffpipe-x.png"), "cannot create", dir, {"folder"});
  expect_refused_up_front(generate(base + "--out " + dir + "/x.png --report-json " + dir + "/folder"),
                          "is a directory", dir, {"folder"});
  // Each numbered image path is checked: out-1.png being a directory fails before out-0.png is written.
  fs::create_directory(dir + "/two-1.png");
  expect_refused_up_front(generate(base + "--num-images-per-prompt 2 --out " + dir + "/two.png"), "two-1.png", dir,
                          {"folder", "two-1.png"});
}

TEST(GenerateCommand, DevNullTakesTheOutputOtherDevicesAreRefusedAndAFullDiskIsNamed) {
  const std::string base = "--model " + tiny_pipe() + " --prompt cat" + kSmall;
  const auto dev_before = partial_files_in("/dev");
  const Timed null_run = generate(base + "--num-images-per-prompt 2 --out /dev/null");
  EXPECT_EQ(null_run.result.exit_code, 0) << null_run.result.output;
  EXPECT_NE(null_run.result.output.find("wrote /dev/null"), std::string::npos) << null_run.result.output;
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_FALSE(fs::exists("/dev/null-0.png"));

  // Any other device is refused before the work (it used to be written after it: /dev/full said ENOSPC late).
  const auto tmp = dp::test::temp_dir("gen-devfull-tmp");
  expect_refused_up_front(generate(base + "--out /dev/full", "TMPDIR=" + tmp + " "), "/dev/full: is a character device",
                          tmp);
  ASSERT_EQ(::stat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(partial_files_in("/dev"), dev_before);

  // A real full disk: a tmpfs filled to the last byte, in a mount namespace of its own (it vanishes with the
  // command). The run does all its work, and its write fails naming ENOSPC, leaving nothing. Where mounting is
  // not allowed, a file size limit (ulimit -f) gives a real EFBIG instead.
  const auto full = dp::test::temp_dir("gen-full");
  const bool can_mount = dp::test::run_command("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs " + full + "'").exit_code == 0;
  const std::string command =
      can_mount ? "unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs " + full + " || exit 99; dd if=/dev/zero of=" +
                      full + "/filler bs=4k 2>/dev/null; " + dp::test::diffpipe_binary() + " generate " + base +
                      " --output-type latent --out " + full + "/x.h5; code=$?; echo; ls -A " + full + "; exit $code'"
                : "sh -c 'trap \"\" XFSZ; ulimit -f 1; exec " + dp::test::diffpipe_binary() + " generate " + base +
                      " --output-type latent --out " + full + "/x.h5'";
  SCOPED_TRACE(can_mount ? "a full 64 kB tmpfs" : "ulimit -f 1 (mounting a tmpfs is not allowed here)");
  const auto result = dp::test::run_command(command);
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("x.h5"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(can_mount ? "(ENOSPC: the file system holding " + full + " is full" : "(EFBIG: "), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find(".partial"), std::string::npos) << result.output;
  EXPECT_TRUE(entries_of(full).empty());
}

TEST(GenerateCommand, SigtermDuringALongWriteLeavesNoPartialFile) {
  // make-random streams 23.8 GB of bf16 weights into one temporary: kill it a moment into the write.
  const auto dir = dp::test::temp_dir("gen-sigterm") + "/model";
  const pid_t child = ::fork();
  if (child == 0) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    const std::string binary = dp::test::diffpipe_binary();
    ::execl(binary.c_str(), binary.c_str(), "make-random", "--arch", "flux-dev", "--out", dir.c_str(), nullptr);
    ::_exit(127);
  }
  // The weights go to DIR/transformer in shards; wait until a temporary of some size exists there.
  const std::string shards = dir + "/transformer";
  bool writing = false;
  for (int i = 0; i < 600 && !writing; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const auto& name : partial_files_in(shards)) {
      struct stat st {};
      writing = writing || (::stat((shards + "/" + name).c_str(), &st) == 0 && st.st_size > (64 << 20));
    }
  }
  EXPECT_TRUE(writing) << "make-random never started its weight file";
  ::kill(child, SIGTERM);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  EXPECT_TRUE(partial_files_in(dir).empty()) << ::testing::PrintToString(partial_files_in(dir));
  EXPECT_TRUE(partial_files_in(shards).empty()) << ::testing::PrintToString(partial_files_in(shards));
}

TEST(GenerateCommand, OutputNameFollowsTheOutputType) {
  const auto dir = dp::test::temp_dir("gen-latent");
  const std::string base = "--model " + tiny_pipe() + " --prompt cat" + kSmall;
  // No --out: latents go to out.h5 in the working folder, not to an HDF5 file named out.png.
  const Timed latent = generate(base + "--output-type latent", "cd " + dir + " && ");
  ASSERT_EQ(latent.result.exit_code, 0) << latent.result.output;
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"out.h5"});
  EXPECT_EQ(io::read_latents_hdf5(dir + "/out.h5").shape.size(), 3u);
  // An extension that promises the other format is refused before any work.
  expect_refused_up_front(generate(base + "--output-type latent --out " + dir + "/x.png"), "name it .h5", dir,
                          {"out.h5"});
  expect_refused_up_front(generate(base + "--out " + dir + "/x.h5"), "name it .png", dir, {"out.h5"});
  const Timed png = generate(base, "cd " + dir + " && ");
  ASSERT_EQ(png.result.exit_code, 0) << png.result.output;
  EXPECT_EQ(entries_of(dir), (std::vector<std::string>{"out.h5", "out.png"}));
}

TEST(GenerateCommand, NonFiniteGuidanceIsRefused) {
  const auto dir = dp::test::temp_dir("gen-guidance");
  for (const char* value : {"nan", "inf", "-inf"}) {
    SCOPED_TRACE(value);
    expect_refused_up_front(generate("--model " + tiny_dev_pipe() + " --prompt cat" + kSmall + "--out " + dir +
                                     "/x.png --guidance " + value),
                            "--guidance must be a finite number", dir);
  }
}

// A copy of the tiny pipeline whose transformer's last projection is all NaN.
std::string pipe_with_nan_proj_out(const std::string& tag) {
  const auto dir = dp::test::temp_dir(tag) + "/pipe";
  fs::copy(tiny_pipe(), dir, fs::copy_options::recursive);
  const std::string weights = dir + "/transformer/diffusion_pytorch_model.safetensors";
  const auto header = io::read_safetensors_header(weights);
  const auto* proj_out = header.find("proj_out.weight");
  EXPECT_NE(proj_out, nullptr);
  EXPECT_EQ(proj_out->dtype, io::DType::F32);
  const std::vector<float> nans(proj_out->numel(), std::numeric_limits<float>::quiet_NaN());
  std::fstream file(weights, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(header.data_offset() + proj_out->begin));
  file.write(reinterpret_cast<const char*>(nans.data()), static_cast<std::streamsize>(proj_out->nbytes()));
  return dir;
}

TEST(GenerateCommand, NanWeightsFailNamingTheStepAndTheStageFails) {
  const auto pipe = pipe_with_nan_proj_out("gen-nan");
  const auto out = dp::test::temp_dir("gen-nan-out");
  const auto r = dp::test::run_command(dp::test::diffpipe_binary() + " generate --model " + pipe +
                                       " --prompt cat --height 32 --width 32 --steps 2 --out " + out + "/x.png");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("denoising step 1/2: the latents hold NaN or Inf after this step: the transformer's output "
                          "was not finite"),
            std::string::npos)
      << r.output;
  // The stage that failed says so, and no success-looking "stage denoise: 0.002 s (loading weights ...)" line
  // is logged while the error unwinds.
  EXPECT_NE(r.output.find("stage denoise failed after"), std::string::npos) << r.output;
  EXPECT_FALSE(std::regex_search(r.output, std::regex("stage denoise: [0-9.]+ (s|ms|us) \\(loading weights"))) << r.output;
  EXPECT_TRUE(entries_of(out).empty()) << r.output;
}

TEST(GenerateCommand, UnquotedPromptIsRefusedWithAHint) {
  const auto dir = dp::test::temp_dir("gen-prompt");
  const Timed run = generate("--model " + tiny_pipe() + " --prompt a cat on a mat" + kSmall + "--out " + dir + "/x.png");
  expect_refused_up_front(run, "must be quoted (--prompt \"a cat on a mat\"); repeat --prompt for several prompts", dir,
                         {}, dp::kExitUsageError);
  // Quoted, and repeated, prompts are what they look like.
  const Timed two = generate("--model " + tiny_pipe() + " --prompt 'a cat on a mat' --prompt dog" + kSmall + "--out " +
                           dir + "/y.png");
  ASSERT_EQ(two.result.exit_code, 0) << two.result.output;
  EXPECT_NE(two.result.output.find("2 prompt(s)"), std::string::npos) << two.result.output;
  EXPECT_EQ(entries_of(dir), (std::vector<std::string>{"y-0.png", "y-1.png"}));
}

TEST(GenerateCommand, InvalidUtf8NamesThePromptOrTheLine) {
  const auto dir = dp::test::temp_dir("gen-utf8");
  const std::string base = "--model " + tiny_pipe() + kSmall + "--out " + dir + "/x.png ";
  // printf's octal escape: /bin/sh (dash) has no $'...' quoting.
  expect_refused_up_front(generate(base + "--prompt fine --prompt \"$(printf 'caf\\351')\""),
                          "prompt 2: invalid UTF-8 at byte 3", dir);
  dp::test::write_file(dir + "/prompts.txt", "a cat\n\nsoup \xff\n");
  expect_refused_up_front(generate(base + "--prompts-file " + dir + "/prompts.txt"),
                          "line 3 of " + dir + "/prompts.txt: invalid UTF-8 at byte 5", dir, {"prompts.txt"});
}

TEST(GenerateCommand, HugeRequestsAreRefusedInMillisecondsWithTheEstimate) {
  const auto dir = dp::test::temp_dir("gen-huge");
  // The address-space cap keeps a regression from eating the machine's memory before the test can fail.
  const std::string capped = "ulimit -v 16000000; ";
  const Timed huge = generate("--model " + tiny_pipe() + " --prompt cat --steps 1 --height 100000 --width 100000 --out " +
                                dir + "/x.png",
                            capped);
  expect_refused_up_front(huge, "100000x100000 x 1 image(s) in fp32 needs at least", dir);
  EXPECT_NE(huge.result.output.find("is available (MemAvailable"), std::string::npos) << huge.result.output;
  EXPECT_LT(huge.seconds, 10.0);
  const std::string base = "--model " + tiny_pipe() + " --prompt cat --out " + dir + "/x.png ";
  expect_refused_up_front(generate(base + "--height 1000016 --width 32 --steps 1", capped),
                          "--height and --width must be at most 1000000", dir);
  expect_refused_up_front(generate(base + "--height 32 --width 32 --steps 1001", capped),
                          "--steps must be in [1, 1000], got 1001", dir);
  expect_refused_up_front(generate(base + "--height 32 --width 32 --steps 1 --num-images-per-prompt 300", capped),
                          "--num-images-per-prompt must be in [1, 256], got 300", dir);
  expect_refused_up_front(
      generate(base + "--height 32 --width 32 --steps 1 --num-images-per-prompt 200 --prompt dog", capped),
      "at most 256 images per run", dir);
}

TEST(GenerateCommand, DtypeDefaultsPerDeviceAndHelpStatesDefaultsAndLimits) {
  const auto dir = dp::test::temp_dir("gen-dtype");
  const Timed run = generate("--model " + tiny_pipe() + " --prompt cat" + kSmall + "--out " + dir + "/x.png --report-json " +
                           dir + "/report.json");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
  EXPECT_NE(run.result.output.find("fp32 on cpu"), std::string::npos) << run.result.output;
  EXPECT_EQ(read_json_file(dir + "/report.json")["dtype"], "fp32");
  const auto help = dp::test::run_command(dp::test::diffpipe_binary() + " generate --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  for (const char* text : {"default fp32 on cpu", "bf16 on cuda", "at most 1000000", "1 to 1000",
                           "at most 256 images per run", "out.h5 with --output-type latent"})
    EXPECT_NE(help.output.find(text), std::string::npos) << text << "\n" << help.output;
}

// --fp8-gemms on the CPU runs the FP8 arithmetic in ATen (the GPU's is tested against it in models_fp8_gemm_test):
// the run says so, and its latents move from bf16's by about an e4m3 rounding, no more.
TEST(GenerateCommand, Fp8GemmsAreNamedInTheLogAndMoveTheLatentsALittle) {
  const auto dir = dp::test::temp_dir("gen-fp8");
  const std::string base = "--model " + tiny_pipe() + " --prompt cat --height 64 --width 64 --steps 2 --dtype bf16 "
                           "--output-type latent --out " + dir;
  const Timed plain = generate(base + "/bf16.h5");
  const Timed fp8 = generate(base + "/fp8.h5 --fp8-gemms");
  ASSERT_EQ(plain.result.exit_code, 0) << plain.result.output;
  ASSERT_EQ(fp8.result.exit_code, 0) << fp8.result.output;
  EXPECT_NE(fp8.result.output.find("run as FP8 GEMMs (--fp8-gemms)"), std::string::npos) << fp8.result.output;
  EXPECT_NE(fp8.result.output.find("blocks planned at fp8"), std::string::npos) << fp8.result.output;
  EXPECT_EQ(plain.result.output.find("FP8"), std::string::npos) << plain.result.output;
  EXPECT_EQ(plain.result.output.find("blocks planned at"), std::string::npos) << plain.result.output;
  const auto a = io::read_latents_hdf5(dir + "/bf16.h5"), b = io::read_latents_hdf5(dir + "/fp8.h5");
  ASSERT_EQ(a.values.size(), b.values.size());
  double difference = 0, norm = 0;
  for (size_t i = 0; i < a.values.size(); ++i) {
    difference += (a.values[i] - b.values[i]) * (a.values[i] - b.values[i]);
    norm += a.values[i] * a.values[i];
  }
  const double relative = std::sqrt(difference / norm);
  std::cout << "latents with --fp8-gemms against bf16: rms relative difference " << relative << "\n";
  EXPECT_GT(relative, 0.0) << "the projections were not converted";
  EXPECT_LT(relative, 0.1);
}

// A checkpoint records --fp8-gemms: resuming it without the flag continues in FP8 (to the uninterrupted run's
// latents), and --fp8-gemms on a bf16 checkpoint is refused before any weight is read, naming the option.
TEST(GenerateCommand, ACheckpointKeepsItsFp8GemmsSetting) {
  const auto dir = dp::test::temp_dir("gen-fp8-resume");
  const std::string base = "--model " + tiny_pipe() + " --prompt cat --height 64 --width 64 --steps 2 --dtype bf16 "
                           "--output-type latent ";
  const auto only_checkpoint = [](const std::string& folder) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(folder)) files.push_back(e.path().string());
    return files.size() == 1 ? files.front() : std::string();
  };
  const Timed fp8 = generate(base + "--fp8-gemms --out " + dir + "/fp8.h5 --checkpoint-dir " + dir +
                             "/fp8-ck --checkpoint-every 1");
  ASSERT_EQ(fp8.result.exit_code, 0) << fp8.result.output;
  const std::string fp8_checkpoint = only_checkpoint(dir + "/fp8-ck");  // step 1's; step 2 ended the run
  ASSERT_FALSE(fp8_checkpoint.empty());
  const auto inspected = dp::test::run_command(dp::test::diffpipe_binary() + " inspect --checkpoint " + fp8_checkpoint);
  EXPECT_NE(inspected.output.find("--microbatch-size 1 --fp8-gemms"), std::string::npos) << inspected.output;
  const Timed resumed = generate("--model " + tiny_pipe() + " --output-type latent --resume " + fp8_checkpoint +
                                 " --out " + dir + "/resumed.h5");
  ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.output;
  EXPECT_NE(resumed.result.output.find("written with --fp8-gemms; this run continues with them"), std::string::npos)
      << resumed.result.output;
  EXPECT_NE(resumed.result.output.find("run as FP8 GEMMs (--fp8-gemms)"), std::string::npos) << resumed.result.output;
  EXPECT_EQ(io::read_latents_hdf5(dir + "/resumed.h5").values, io::read_latents_hdf5(dir + "/fp8.h5").values);

  const Timed plain = generate(base + "--out " + dir + "/bf16.h5 --checkpoint-dir " + dir +
                               "/bf16-ck --checkpoint-every 1");
  ASSERT_EQ(plain.result.exit_code, 0) << plain.result.output;
  const Timed mixed = generate("--model " + tiny_pipe() + " --output-type latent --fp8-gemms --resume " +
                               only_checkpoint(dir + "/bf16-ck") + " --out " + dir + "/mixed.h5");
  EXPECT_EQ(mixed.result.exit_code, 3) << mixed.result.output;
  EXPECT_NE(mixed.result.output.find("--fp8-gemms: checkpoint off, this run on"), std::string::npos)
      << mixed.result.output;
  EXPECT_FALSE(fs::exists(dir + "/mixed.h5"));
}

TEST(Cli, UnknownCommandsAreNamedAndGlobalOptionsMayFollowTheCommand) {
  const auto unknown = dp::test::run_command(dp::test::diffpipe_binary() + " genrate --prompt cat");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("unknown command 'genrate'"), std::string::npos) << unknown.output;
  // --log-level after the command, in the torch-free front and in diffpipe-torch.
  const auto inspect = dp::test::run_command(dp::test::diffpipe_binary() + " inspect --model " + tiny_pipe() +
                                             " --log-level warn");
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  const auto dir = dp::test::temp_dir("gen-log-level");
  const Timed quiet = generate("--model " + tiny_pipe() + " --prompt cat" + kSmall + "--out " + dir +
                               "/x.png --log-level warn");
  EXPECT_EQ(quiet.result.exit_code, 0) << quiet.result.output;
  EXPECT_EQ(quiet.result.output.find("[info]"), std::string::npos) << quiet.result.output;
}

}  // namespace
}  // namespace dp::cli
