// libFuzzer target over the checkpoint reader (dp::io::read_checkpoint), which `generate --resume` and
// `inspect --checkpoint` run on files from a shared directory.
//
// The reader's contract is "reject with dp::Error or return a checkpoint that is safe to use". dp::Error is
// the only exception swallowed; an accepted checkpoint is checked against the invariants the resume relies on
// (every tensor's byte count matches its shape and dtype, one step index per image and per tensor row, steps
// within the schedule). HDF5 reads a file, not bytes: each input is written to one temporary file first.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "fuzz_verdict.h"
#include "io/checkpoint_file.h"

namespace {

[[noreturn]] void invariant_failed(const char* what) {
  std::fprintf(stderr, "checkpoint_fuzz: accepted checkpoint breaks invariant: %s\n", what);
  std::abort();
}

#define FUZZ_REQUIRE(cond)                 \
  do {                                     \
    if (!(cond)) invariant_failed(#cond);  \
  } while (0)

const std::string& scratch_path() {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp && *tmp ? tmp : "/tmp") + "/checkpoint_fuzz." + std::to_string(::getpid()) + ".h5";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  try {
    const dp::io::Checkpoint c = dp::io::read_checkpoint(path);
    const size_t images = c.image_steps.size();
    FUZZ_REQUIRE(images == c.run.prompts.size() * static_cast<size_t>(c.run.num_images_per_prompt));
    for (const dp::io::RawTensor* t : {&c.latents, &c.prompt_embeds, &c.pooled}) {
      FUZZ_REQUIRE(t->nbytes == static_cast<size_t>(t->numel()) * dp::io::dtype_bytes(t->dtype));
      FUZZ_REQUIRE(static_cast<size_t>(t->shape[0]) == images);
    }
    for (int32_t s : c.image_steps) FUZZ_REQUIRE(s >= 0 && s <= c.run.steps);
    FUZZ_REQUIRE(c.sigmas.size() == static_cast<size_t>(c.run.steps) + 1);
    FUZZ_REQUIRE(c.timesteps.size() == static_cast<size_t>(c.run.steps));
    dp::fuzz::note_accepted();
  } catch (const dp::Error&) {
    dp::fuzz::note_rejected();
  }
  std::remove(path.c_str());
  return 0;
}
