#pragma once
// Every path a `diffpipe generate` run uses, checked on every rank before anything loads, under the output
// policy of core/output_policy.h: each output this rank writes can be written (no link as its last component,
// no FIFO or device but /dev/null, an existing folder), no two paths of the run are one file, nothing is written
// into the model folder, the embeddings cache is a cache, and the checkpoint folder holds no other run's files
// unless the run resumes or shares it. Torch-free.
#include <string>
#include <vector>

namespace dp::cli {

struct GeneratePaths {
  std::vector<std::string> outputs;  // images or latents: --out, or the PATH-i.png derived from it
  std::string report_json;           // --report-json (rank 0)
  std::string torch_profile;         // --torch-profile (rank 0)
  std::string report;                // --report as given: rank r of N writes rank_file_path(report, r, N)
  std::string checkpoint_dir;        // --checkpoint-dir (rank 0 writes into it)
  std::string run_id;                // the run its checkpoints belong to
  bool may_share_checkpoint_dir = false;  // --resume or --share-checkpoint-dir
  std::string embeddings_cache;      // --embeddings-cache (rank 0 reads and rewrites it)
  std::string resume_file;           // the checkpoint --resume reads (the one picked in a folder)
  std::string prompts_file, config, model;
  int rank = 0, world_size = 1;
};

// Throws naming the option and the path on the first problem. On rank 0 it also creates the checkpoint folder
// (after every other check passed), so that a refused run leaves nothing behind.
void check_generate_paths(const GeneratePaths& paths);

}  // namespace dp::cli
