#pragma once
// The one way diffpipe writes an output file (images, latents, reports, checkpoints, caches, configs, weights):
// readers see the old content or the new, never a part, and a failure leaves nothing behind. It follows the
// output policy of core/output_policy.h: regular files only, never through a symbolic link.
//
//   - The data goes to a unique temporary file in the target's directory (".NAME.XXXXXX.partial", created
//     with O_EXCL), so two runs writing the same path never share a temporary.
//   - commit() flushes it to disk, renames it over the target and syncs the directory. A rename replaces the
//     name itself: a symbolic link or a hard link there is never written through (a link to a regular file
//     elsewhere keeps that file's content). The result has the mode the replaced file had, or the umask's for
//     a new file (not mkstemp's 0600).
//   - A symlink, directory, FIFO, socket or device as target is refused when the writer is made, before any
//     data is produced (check_output_path). /dev/null is accepted and discards: its temporary lives in $TMPDIR
//     (or /tmp; /dev is not writable for most users) and commit() removes it.
//   - write() runs the code that fills the temporary and names ENOSPC, EDQUOT and EFBIG in its failure.
//   - The temporary is removed when the writer is destroyed uncommitted (exceptions), and on SIGINT, SIGTERM
//     or SIGHUP once install_partial_file_cleanup() has run.
#include <functional>
#include <string>

#include "core/output_policy.h"

namespace dp {

class AtomicFile {
 public:
  // Validates `target` (check_output_path) and creates the temporary.
  explicit AtomicFile(std::string target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Where to write: a regular file, empty, in the target's directory.
  const std::string& temp_path() const { return temp_; }
  // Runs `fill(temp_path())`; a failure is rethrown with the cause named when it was a full file system, a
  // quota or a file size limit (ENOSPC, EDQUOT, EFBIG).
  void write(const std::function<void(const std::string& temp)>& fill);
  const std::string& target() const { return target_; }
  // Publishes the temporary as the target (see above). Throws naming the target on any failure, after
  // which nothing is left behind.
  void commit();

 private:
  std::string target_;
  std::string temp_;
  bool discard_ = false;  // /dev/null
  bool committed_ = false;
};

// Writes `bytes` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, const std::string& bytes);

// Makes SIGINT, SIGTERM and SIGHUP remove every live temporary before the process dies of the signal (the
// previous disposition is then restored and the signal raised again). A signal the process ignores (nohup's
// SIGHUP) stays ignored. Idempotent.
void install_partial_file_cleanup();

}  // namespace dp
