#pragma once
// A checkpoint folder as the runs that share it see it: its checkpoints grouped by the run that wrote them
// (run id, request and model fingerprints; io/checkpoint_file.h), so that
//   - rotation removes only its own run's older files, and logs each removal;
//   - --resume DIR takes the newest checkpoint of the one run this request matches, and refuses, naming them,
//     when several runs match or none does among several;
//   - a run that neither resumes nor was told to share is refused a folder that holds other runs' files.
// Only regular files named checkpoint-stepNNNNNN-RUNID.h5 (or checkpoint-stepNNNNNN.h5, format version 1) are
// checkpoints; a link or other entry under such a name is never read, replaced or removed. Torch-free.
#include <string>
#include <vector>

#include "io/checkpoint_file.h"

namespace dp::io {

struct CheckpointEntry {
  std::string path;
  int step = -1;          // from the name
  std::string problem;    // why it is not a usable checkpoint (a link, unreadable, damaged); empty when it is
  Checkpoint header;      // read_checkpoint_header's result when `problem` is empty (no tensors)
  // Which run it belongs to: the run id, or for a version 1 file "v1 request R model M".
  std::string run_key() const;
};

// The checkpoint-named entries of `dir`, oldest step first; each readable one with its header. Throws when
// `dir` is not a folder.
std::vector<CheckpointEntry> scan_checkpoint_dir(const std::string& dir);

// For a run writing checkpoints into `dir` as run `run_id`: throws, listing them, when `dir` holds checkpoints
// of other runs (or entries under checkpoint names that cannot be read) unless `may_share` (--resume, or
// --share-checkpoint-dir). Other runs' files are never touched either way.
void check_checkpoint_dir_for_run(const std::string& dir, const std::string& run_id, bool may_share);

// What --resume DIR knows of the request before it loads anything: the model's fingerprint and the options
// given on the command line (CheckpointRun's fields named in `given`, as compare_runs takes them).
struct ResumeRequest {
  std::string model_fingerprint;
  CheckpointRun run;
  std::vector<std::string> given;
};

// The checkpoint --resume DIR continues: the newest one that reads and validates of the run this request
// matches (same model, same options where given); damaged newer ones are skipped with a warning. With
// checkpoints of one run only, that run is taken (a difference is then reported by the caller's comparison).
// Throws, naming each run with its steps and options, when several runs match, or none does among several,
// or when there is no valid checkpoint.
std::string select_resume_checkpoint(const std::string& dir, const ResumeRequest& request);

// Rotation: removes run `run_id`'s checkpoints in `dir` but the newest `keep` (keep >= 1), and its own
// temporaries left by a killed writer; each removal is logged. Other runs' files, links and anything else are
// left alone. Returns the paths removed.
std::vector<std::string> prune_run_checkpoints(const std::string& dir, const std::string& run_id, int keep);

// One line about a run's checkpoints for messages: "run 3f9a...: steps 2, 4 (checkpoint-step000004-...h5);
// 4 steps, 64x96, seed 7, 2 prompt(s) "a cat", ...".
std::string describe_run(const std::vector<const CheckpointEntry*>& entries);

}  // namespace dp::io
