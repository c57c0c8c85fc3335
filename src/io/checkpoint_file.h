#pragma once
// Denoising checkpoints in HDF5: the coordinator's trajectory (latents of every image with its own step index,
// the schedule, the prompts and their embeddings, the run's options and the model's fingerprint), so that a
// preempted job resumes exactly where it stopped. Torch-free: tensors travel as raw bytes with a dtype name,
// so `diffpipe inspect --checkpoint` and the fuzz targets read checkpoints without LibTorch.
//
// Layout (format version 3; README.md "Checkpoints" documents it for h5py/h5dump users):
//   /latents               (B, seq, C)   packed latents in the run dtype (fp32: float32; bf16/fp16: their bits
//                                        as uint16, dataset attribute `dtype` says which)
//   /image_steps           (B,) int32    denoising steps done per image (microbatches are not all at one step)
//   /sigmas                (steps+1,) float32, /timesteps (steps,) float32: the full schedule
//   /prompts               (P,) fixed-length strings, UTF-8
//   /prompt_embeds         (B, N_txt, D) T5 output per image, run dtype as /latents
//   /pooled_prompt_embeds  (B, D_pooled) CLIP pooled output per image
//   root attributes        format ("diffpipe-checkpoint"), format_version, height, width, steps, guidance,
//                          seed (as text: a uint64 does not fit a double), dtype, num_images_per_prompt,
//                          max_sequence_length, microbatch_size, model, model_fingerprint, device_map,
//                          world_size, written_by, run_id, request_fingerprint, content_digest
// A checkpoint belongs to a run: `run_id` (16 hex digits, drawn when a run starts and kept by the runs that
// resume it) and `request_fingerprint` (the options that fix the result) with `model_fingerprint` say whose it
// is, so that a folder shared by several runs is rotated and resumed per run (io/checkpoint_dir.h).
// Version 1 files (before run identities) are still read: they have no run_id, and their request fingerprint
// is computed from their attributes.
// Format version 3 adds, and is written only by runs that use them (others write version 2):
//   /negative_prompts      (N,) strings, N = 1 or P: true CFG's negative prompts as given
//   /negative_prompt_embeds, /negative_pooled_prompt_embeds: their T5 and CLIP outputs per image, as above
//   /custom_sigmas         (steps,) float64: --sigmas as given (before the scheduler's shift)
//   root attributes        true_cfg_scale; initial_latents (--latents: the file and a digest of its values);
//                          lora (JSON: mode, adapters with name, path and scale, and their fingerprint);
//                          transformer_gemms ("fp8" with --fp8-gemms; absent otherwise, and in older files)
// `content_digest` hashes every dataset's bytes and the attributes above it: a file that HDF5 opens but whose
// contents were torn or flipped is refused.
//
// Files are written through AtomicFile (temporary in the same directory, fsync, rename, fsync of the
// directory): a crash leaves the previous checkpoint or the new one, never a half-written file under the
// final name.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dp::io {

// The newest format this build reads and writes (a run writes the oldest version that holds what it uses).
inline constexpr int kCheckpointFormatVersion = 3;
inline constexpr const char* kCheckpointFormatName = "diffpipe-checkpoint";
// CheckpointRun::transformer_gemms of a run with --fp8-gemms, the one value this build writes and reads.
inline constexpr const char* kFp8TransformerGemms = "fp8";

// A tensor as bytes: dtype "fp32", "bf16" or "fp16", row-major. `data` stays valid while `owner` lives (or
// while the writer's caller keeps the source alive, for views).
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::shared_ptr<const void> owner;

  int64_t numel() const;
  static RawTensor owning(std::string dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
};
size_t dtype_bytes(const std::string& dtype);  // throws for anything but fp32, bf16, fp16

// The options a run was written with: what --resume takes when the user does not give them.
struct CheckpointRun {
  std::vector<std::string> prompts;
  int num_images_per_prompt = 1;
  int64_t height = 0, width = 0;
  int steps = 0;
  double guidance = 0;
  uint64_t seed = 0;
  int max_sequence_length = 0;
  std::string dtype;  // canonical run dtype name
  int64_t microbatch_size = 1;
  // Format version 3.
  std::vector<std::string> negative_prompts;  // true CFG's negative prompts as given (one, or one per prompt)
  double true_cfg_scale = 1.0;
  std::vector<double> custom_sigmas;  // --sigmas; empty: FluxPipeline's default schedule
  std::string initial_latents;        // --latents: file and value digest; empty: drawn from the seed
  std::string lora;                   // the adapters (JSON); empty: none
  std::string transformer_gemms;      // kFp8TransformerGemms (--fp8-gemms); empty: the run's dtype
  bool fp8_gemms() const { return transformer_gemms == kFp8TransformerGemms; }
  void set_fp8_gemms(bool on) { transformer_gemms = on ? kFp8TransformerGemms : ""; }
  bool uses_format_3() const;
};

// What identifies a request's result: every option of CheckpointRun, hashed (16 hex digits); version 3's
// options only when used.
std::string request_fingerprint(const CheckpointRun& run);

// A fresh run id: 16 hex digits from the system's random source.
std::string new_run_id();
// Whether `id` is a run id (16 lowercase hex digits).
bool is_run_id(const std::string& id);

struct Checkpoint {
  int format_version = kCheckpointFormatVersion;
  CheckpointRun run;
  std::string run_id;               // empty in a version 1 file
  std::string request_fingerprint;  // request_fingerprint(run); set by the writer, checked by the reader
  std::string model_dir;          // informational: where the model was
  std::string model_fingerprint;  // transformer config + tensor headers (runtime::model_fingerprint)
  std::string device_map;         // as given (or the default) and the plan it gave
  int world_size = 1;
  std::string written_by;         // build id
  std::vector<int32_t> image_steps;  // per image, 0..steps
  std::vector<float> sigmas, timesteps;
  RawTensor latents, prompt_embeds, pooled;
  RawTensor negative_prompt_embeds, negative_pooled;  // true CFG only (format version 3)

  int steps_done() const;  // the slowest image's steps
  bool finished() const { return steps_done() == run.steps; }
};

// Writes atomically (see above); throws naming the path on any failure, leaving nothing behind.
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Reads and validates every field (types, ranks, sizes against each other and against the run's options,
// the format version, the content digest); throws naming the file and what is wrong.
Checkpoint read_checkpoint(const std::string& path);
// The options, identity (run id, fingerprints) and steps per image of a checkpoint, without its tensors and
// without the digest check: what a folder listing needs (io/checkpoint_dir.h). read_checkpoint validates.
Checkpoint read_checkpoint_header(const std::string& path);

// "checkpoint-step000012-RUNID.h5": names sort by the slowest image's step, and two runs never share one.
std::string checkpoint_file_name(int steps_done, const std::string& run_id);

// What differs between a checkpoint and a run: one line per field, empty when they agree. Fields the user
// did not give are not compared (--resume takes them from the checkpoint); `given` names those given.
struct RunComparison {
  std::string field;
  std::string in_checkpoint;
  std::string in_run;
};
std::vector<RunComparison> compare_runs(const CheckpointRun& checkpoint, const CheckpointRun& run,
                                        const std::vector<std::string>& given);

}  // namespace dp::io
