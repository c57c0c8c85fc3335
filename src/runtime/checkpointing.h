#pragma once
// The coordinator's side of checkpoints (io/checkpoint_file.h holds the format, io/checkpoint_dir.h the folder
// shared by runs, runtime/stop_request.h the stop signals): tensors to
// and from checkpoint records, the "checkpoint now" decision at each step boundary of the denoising loop,
// and the prompt-embedding cache around FluxPipeline::encode_prompts.
#include <ATen/ATen.h>

#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "io/checkpoint_file.h"
#include "pipeline/denoise_loop.h"
#include "pipeline/flux_pipeline.h"
#include "runtime/stop_request.h"

namespace dp::runtime {

struct CheckpointOptions {
  std::string dir;           // --checkpoint-dir; empty: no checkpoints
  int every = 0;             // --checkpoint-every K steps; 0: only on a stop signal
  int keep = 2;              // --keep-checkpoints N of this run's own checkpoints
  std::string run_id;        // the run the checkpoints belong to (io/checkpoint_file.h): new, or the resumed one's
  bool share_dir = false;    // --share-checkpoint-dir: other runs' checkpoints may lie in `dir`
  std::shared_ptr<const io::Checkpoint> resume;  // --resume, read and validated by the command
  std::string resume_path;
  std::string embeddings_cache;  // --embeddings-cache FILE.h5
};

io::RawTensor to_raw(const at::Tensor& tensor);  // a CPU contiguous copy, kept alive by the record
at::Tensor from_raw(const io::RawTensor& raw, const at::Device& device);

// Called at each step boundary; writes a checkpoint every `every` steps and on a stop request from any rank,
// and says whether to stop. `last_path` is the newest checkpoint written. Files are named and rotated per
// run (options.run_id): other runs' checkpoints in the folder are never replaced or removed.
//
// The loop pays only for copying the latents to the host: the file is written (HDF5, fsync, rename, fsync
// of the directory) on a background thread while the next steps run. One write at a time: a checkpoint due
// while the previous one is still being written waits for it. A stop waits for its checkpoint to be on disk
// before at_boundary returns, and finish() (or the destructor) waits for the last one; a failed write is
// rethrown there, so it ends the run like any other error.
class Checkpointer {
 public:
  // `base`: what a checkpoint records besides the loop's state (run, model, device map, world size, schedule,
  // prompts and their embeddings).
  Checkpointer(const CheckpointOptions& options, io::Checkpoint base);
  ~Checkpointer();
  bool at_boundary(const pipeline::LoopState& state);
  // Waits for the write in progress; rethrows its failure.
  void finish();
  bool stopped() const { return stopped_; }
  const std::string& last_path() const { return last_path_; }
  int checkpoints_written() const { return written_; }

 private:
  void write(const pipeline::LoopState& state);
  const CheckpointOptions& options_;
  std::thread writer_;
  std::exception_ptr write_failure_;
  io::Checkpoint base_;
  int last_written_step_ = -1;
  int hold_at_step_ = -1;  // DIFFPIPE_TEST_HOLD_AT_STEP (tests only)
  bool held_ = false;
  bool stopped_ = false;
  std::string last_path_;
  int written_ = 0;
};

// FluxPipeline::encode_prompts through the cache at `cache_path` (empty: no cache). On a hit for every
// prompt CLIP and T5 are not loaded and the log says so; otherwise every prompt is encoded as without the
// cache and the missing entries are added.
pipeline::PromptEmbeddings encode_prompts_cached(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                                                 const std::string& cache_path);
// The options a checkpoint records and --resume compares, from a request (true CFG, custom sigmas, initial
// latents and adapters included) and whether the blocks' projections run as FP8 GEMMs (--fp8-gemms).
io::CheckpointRun checkpoint_run(const pipeline::GenerateRequest& request, int64_t microbatch_size, bool fp8_gemms);
// The prompts' (and negative prompts') embeddings, one row per image, into and out of a checkpoint record.
void record_embeddings(io::Checkpoint& checkpoint, const pipeline::PromptEmbeddings& prompts);
pipeline::PromptEmbeddings embeddings_from_checkpoint(const io::Checkpoint& checkpoint, const at::Device& device);
// The text encoders' identity for the cache key: configs and tensor headers of text_encoder and text_encoder_2.
std::string encoder_fingerprint(const io::ModelFolder& folder);

}  // namespace dp::runtime
