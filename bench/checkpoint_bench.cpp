// Checkpoint write time and file size for FLUX.1-dev-size state: 4 images at 1024x1024 (packed latents
// 4096 x 64 each), T5 embeddings 512 x 4096 and CLIP pooled 768 per image, bf16 as on the GPU. Each write is
// the real one (HDF5 into a temporary, fsync, rename, fsync of the directory).
//   checkpoint_bench [DIR] [--writes N] [--images B] [--step-ms MS]
// Only the write and read times are measured here. --step-ms is a step time measured elsewhere (on the machine
// whose steps the checkpoints would interrupt); given, the write is also printed as a fraction of it, labelled
// as arithmetic on that input. Without it no fraction is printed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint_file.h"

int main(int argc, char** argv) {
  std::string dir = std::filesystem::temp_directory_path() / "diffpipe-checkpoint-bench";
  int writes = 10, images = 4;
  double step_ms = 0;  // none given: no fraction of a step is printed
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--writes" && i + 1 < argc) writes = std::atoi(argv[++i]);
    else if (arg == "--images" && i + 1 < argc) images = std::atoi(argv[++i]);
    else if (arg == "--step-ms" && i + 1 < argc) step_ms = std::atof(argv[++i]);
    else dir = arg;
  }
  std::filesystem::create_directories(dir);
  const auto filled = [](size_t bytes, unsigned seed) {
    std::vector<uint8_t> v(bytes);
    for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>((i * 2654435761u + seed) >> 13);
    return v;
  };
  dp::io::Checkpoint c;
  for (int p = 0; p < images; ++p) c.run.prompts.push_back("a prompt of a benchmark " + std::to_string(p));
  c.run.height = c.run.width = 1024;
  c.run.steps = 50;
  c.run.guidance = 3.5;
  c.run.max_sequence_length = 512;
  c.run.dtype = "bf16";
  c.model_fingerprint = "0000000000000000";
  c.device_map = "pipeline";
  c.written_by = "checkpoint_bench";
  c.run_id = dp::io::new_run_id();
  c.image_steps.assign(static_cast<size_t>(images), 25);
  for (int i = 0; i <= 50; ++i) c.sigmas.push_back(1.0f - i / 50.0f);
  for (int i = 0; i < 50; ++i) c.timesteps.push_back(1000.0f - i * 20.0f);
  const int64_t b = images;
  c.latents = dp::io::RawTensor::owning("bf16", {b, 4096, 64}, filled(static_cast<size_t>(b) * 4096 * 64 * 2, 1));
  c.prompt_embeds = dp::io::RawTensor::owning("bf16", {b, 512, 4096}, filled(static_cast<size_t>(b) * 512 * 4096 * 2, 2));
  c.pooled = dp::io::RawTensor::owning("bf16", {b, 768}, filled(static_cast<size_t>(b) * 768 * 2, 3));

  std::vector<double> ms;
  const std::string path = dir + "/" + dp::io::checkpoint_file_name(25, c.run_id);
  for (int i = 0; i < writes; ++i) {
    const auto started = std::chrono::steady_clock::now();
    dp::io::write_checkpoint(path, c);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  }
  std::sort(ms.begin(), ms.end());
  // What the denoising loop itself pays with the background writer (runtime/checkpointing.h): one host copy
  // of the latents (on a GPU run a device-to-host copy of the same bytes); the write overlaps the next steps.
  std::vector<double> copy_ms;
  std::vector<uint8_t> host(c.latents.nbytes);
  for (int i = 0; i < 20; ++i) {
    const auto started = std::chrono::steady_clock::now();
    std::memcpy(host.data(), c.latents.data, host.size());
    copy_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  }
  std::sort(copy_ms.begin(), copy_ms.end());
  const double copy = copy_ms[copy_ms.size() / 2];
  const auto read_started = std::chrono::steady_clock::now();
  dp::io::read_checkpoint(path);
  const double read_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - read_started).count();
  const double median = ms[ms.size() / 2];
  const auto size = std::filesystem::file_size(path);
  std::printf("checkpoint of %d images at 1024x1024 (bf16 latents %dx4096x64, T5 %dx512x4096, pooled %dx768)\n",
              images, images, images, images);
  std::printf("file size: %.1f MB (latents %.1f MB, embeddings %.1f MB)\n", size / 1e6, c.latents.nbytes / 1e6,
              (c.prompt_embeds.nbytes + c.pooled.nbytes) / 1e6);
  std::printf("write (HDF5 + fsync + rename + dir fsync): median %.1f ms, min %.1f ms, max %.1f ms over %d writes\n",
              median, ms.front(), ms.back(), writes);
  std::printf("read and validate: %.1f ms\n", read_ms);
  std::printf("in the loop with the background writer: host copy of the latents %.2f ms (median of 20)\n", copy);
  if (step_ms > 0) {
    // Arithmetic, not a measurement: this machine's write time over a step time given on the command line.
    std::printf("against a %.1f ms step GIVEN with --step-ms (not measured here): synchronous write %.1f%% of a step "
                "at --checkpoint-every 1, %.2f%% at 10; the host copy %.2f%% (the background write %s)\n",
                step_ms, 100 * median / step_ms, 10 * median / step_ms, 100 * copy / step_ms,
                median < step_ms ? "is shorter than that step, so checkpoints do not queue"
                                 : "is LONGER than that step: each checkpoint waits for the previous one");
  } else {
    std::printf("no --step-ms given: pass a step time measured on the target machine to see these as fractions\n");
  }
  std::filesystem::remove(path);
  return 0;
}
