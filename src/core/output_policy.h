#pragma once
// What diffpipe writes, and what it never touches: the one policy every writer follows (images, latents,
// reports, checkpoints, the embeddings cache, JSON files, make-* folders), through core/atomic_file.h.
//
//   - Only regular files are written, always by renaming a finished temporary over the name. A rename replaces
//     the directory entry and never follows a symbolic link, so a file diffpipe derives a name for (PATH-0.png,
//     PATH.rank1.json, checkpoint-stepN-RUN.h5, a temporary) can never write through a link planted there.
//   - A path whose last component is a symbolic link is refused, saying so; links among the folders on the way
//     are followed as usual.
//   - A FIFO, socket, device or directory is refused before any work. /dev/null is the exception: the output
//     is computed and discarded (there is nothing to replace).
//   - A run's paths are compared before anything loads: two outputs that are one file, an output that is one of
//     the run's inputs (the same resolved path or the same inode), and an output inside the model folder are
//     refused, naming both options.
//   - A failed write names a full file system (ENOSPC), an exhausted quota (EDQUOT) and a size limit (EFBIG).
#include <string>
#include <vector>

namespace dp {

// Throws, naming the path and the rule it breaks, unless `path` can be written as an output: its last
// component is not a symlink; it is absent, a regular file or /dev/null; and its directory exists and accepts a
// new file (tried for real: a permission check alone says yes to root on a read-only mount).
void check_output_path(const std::string& path);

// Whether `path` is the null device (itself, or a name of it such as a hard link: a character device with
// /dev/null's device number). Links to it are still refused as links.
bool is_dev_null(const std::string& path);

// One path a run uses, for check_distinct_paths.
struct RunPath {
  enum class Use {
    output,          // a file the run writes (or replaces)
    output_folder,   // a folder the run writes files into (--checkpoint-dir)
    input,           // a file the run only reads (--prompts-file, --config, --resume FILE)
    input_folder,    // a folder the run only reads (the model, --resume DIR)
    input_output,    // a file the run reads and then replaces (--embeddings-cache)
  };
  std::string option;  // how the user named it: "--out", "--report-json", "--model" ...
  std::string path;
  Use use = Use::output;
};

// Throws naming both options when two of `paths` collide: an output (or the cache) that is another output, an
// input or the cache (the same resolved path, or the same inode where both exist); an output or an output
// folder inside an input folder or equal to it. Outputs that are all /dev/null do not collide. Inputs may share
// files with each other.
void check_distinct_paths(const std::vector<RunPath>& paths);

// " (ENOSPC: the file system holding DIR is full; free space or write elsewhere)" and the like for ENOSPC,
// EDQUOT and EFBIG; for other codes (and 0) the file system holding `directory` is
// checked, and a full one is still named as ENOSPC (HDF5 and libpng do not always keep errno). Empty when the
// failure had nothing to do with space.
std::string space_failure_text(int error_number, const std::string& directory);

// "PATH.rankR.json": the file rank R of a world of N > 1 ranks writes for a per-rank output named PATH (the
// extension kept last); PATH itself in a world of one.
std::string rank_file_path(const std::string& path, int rank, int world_size);

}  // namespace dp
