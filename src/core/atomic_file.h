#pragma once
// The one way diffpipe writes an output file (images, latents, reports, configs, weights): readers see the
// old content or the new, never a part, and a failure leaves nothing behind.
//
//   - The data goes to a unique temporary file in the target's directory (".NAME.XXXXXX.partial"), so two
//     runs writing the same path never share a temporary.
//   - commit() flushes it to disk, renames it over a regular (or absent) target and syncs the directory. The
//     result has the mode the replaced file had, or the umask's for a new file (not mkstemp's 0600).
//   - A non-regular target (/dev/null, a FIFO, a device) is never replaced: its temporary lives in $TMPDIR
//     (or /tmp; /dev is not writable for most users) and commit() copies the bytes into the target in place,
//     reporting its errors (ENOSPC from /dev/full).
//   - A symlink is written through: the file it points at gets the data and the link stays.
//   - A directory as target is refused before any work: check_output_path().
//   - The temporary is removed when the writer is destroyed uncommitted (exceptions), and on SIGINT, SIGTERM
//     or SIGHUP once install_partial_file_cleanup() has run.
#include <string>

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
  const std::string& target() const { return target_; }
  // Publishes the temporary as the target (see above). Throws naming the target on any failure, after
  // which nothing is left behind.
  void commit();

 private:
  std::string target_;
  std::string temp_;
  bool committed_ = false;
};

// Throws, naming the path and what is wrong, unless `path` can be written as an output: its directory
// exists and accepts a new file (tried for real: a permission check alone says yes to root on a read-only
// mount), and the path is absent, a regular file, or a non-regular file that can be opened for writing.
void check_output_path(const std::string& path);

// Writes `bytes` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, const std::string& bytes);

// Makes SIGINT, SIGTERM and SIGHUP remove every live temporary before the process dies of the signal (the
// previous disposition is then restored and the signal raised again). A signal the process ignores (nohup's
// SIGHUP) stays ignored. Idempotent.
void install_partial_file_cleanup();

}  // namespace dp
