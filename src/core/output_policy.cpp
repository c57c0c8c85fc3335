#include "core/output_policy.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/error.h"

namespace dp {
namespace {

namespace fs = std::filesystem;

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string file_name_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

bool is_null_device(const struct stat& st) { return S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3); }

// Where a path leads, as far as it exists: symlinks and ".." resolved in the part that exists.
std::string resolved(const std::string& path) {
  std::error_code ec;
  fs::path out = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::absolute(path).lexically_normal().string() : out.string();
}

std::optional<std::pair<dev_t, ino_t>> inode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return std::make_pair(st.st_dev, st.st_ino);
}

bool inside(const std::string& path, const std::string& folder) {
  if (path == folder) return true;
  const std::string prefix = folder == "/" ? folder : folder + "/";
  return path.rfind(prefix, 0) == 0;
}

bool is_output(RunPath::Use use) {
  return use == RunPath::Use::output || use == RunPath::Use::input_output;
}

std::string named(const RunPath& p) { return p.option + " " + p.path; }

}  // namespace

bool is_dev_null(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && is_null_device(st);
}

void check_output_path(const std::string& path) {
  DP_CHECK(!path.empty(), "the output path is empty");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const fs::path target = fs::read_symlink(path, ec);
      DP_FAIL(path, ": is a symbolic link", ec ? std::string() : " (to " + target.string() + ")",
              "; diffpipe does not write through links: name the file itself, or another path");
    }
    DP_CHECK(!S_ISDIR(st.st_mode), path, ": is a directory; name a file to write");
    if (is_null_device(st)) return;  // discards the output; nothing to create
    DP_CHECK(S_ISREG(st.st_mode), path, ": is ", kind_of(st.st_mode),
             "; diffpipe writes only regular files (and /dev/null, which discards the output)");
  }
  const std::string dir = directory_of(path);
  struct stat dir_st {};
  DP_CHECK(::stat(dir.c_str(), &dir_st) == 0 && S_ISDIR(dir_st.st_mode), path, ": directory ", dir,
           " does not exist");
  // A real attempt: permissions alone say yes to root on a read-only file system. O_EXCL never follows a link.
  std::string probe = (dir == "/" ? "" : dir) + "/." + file_name_of(path) + ".XXXXXX.probe";
  const int fd = ::mkstemps(probe.data(), 6);
  DP_CHECK(fd >= 0, path, ": cannot create a file in ", dir, " (", std::strerror(errno), ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_distinct_paths(const std::vector<RunPath>& paths) {
  struct Seen {
    const RunPath* use;
    std::string where;
    std::optional<std::pair<dev_t, ino_t>> inode;
    bool null_device;
  };
  std::vector<Seen> seen;
  for (const auto& p : paths) {
    if (p.path.empty()) continue;
    seen.push_back({&p, resolved(p.path), inode_of(p.path), is_dev_null(p.path)});
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    for (size_t j = i + 1; j < seen.size(); ++j) {
      const Seen* a = &seen[i];
      const Seen* b = &seen[j];
      const auto ua = a->use->use, ub = b->use->use;
      if (!is_output(ua) && !is_output(ub) && ua != RunPath::Use::output_folder && ub != RunPath::Use::output_folder)
        continue;  // inputs may share files
      if (a->null_device && b->null_device) continue;
      const bool same = a->where == b->where || (a->inode && b->inode && *a->inode == *b->inode);
      // Files against files: one file under two names.
      const bool a_folder = ua == RunPath::Use::output_folder || ua == RunPath::Use::input_folder;
      const bool b_folder = ub == RunPath::Use::output_folder || ub == RunPath::Use::input_folder;
      if (!a_folder && !b_folder) {
        DP_CHECK(!same, named(*a->use), " and ", named(*b->use), " are the same file",
                 a->where == b->where ? " (" + a->where + ")" : std::string(" (one inode under two names)"),
                 "; ", is_output(ua) && is_output(ub) ? "one would overwrite the other" : "the run would overwrite what it reads",
                 ": give them different paths");
        continue;
      }
      // A folder the run reads against anything it writes: nothing may land inside it. (Writing beside the
      // checkpoints of an output folder is fine.)
      if (ub == RunPath::Use::input_folder) std::swap(a, b);
      if (a->use->use != RunPath::Use::input_folder) continue;
      const auto other_use = b->use->use;
      if (!is_output(other_use) && other_use != RunPath::Use::output_folder) continue;
      DP_CHECK(!inside(b->where, a->where) && !same, named(*b->use), " is inside ", named(*a->use),
               " (", b->where, "); diffpipe never writes into a folder it reads: choose a path outside it");
    }
  }
}

std::string space_failure_text(int error_number, const std::string& directory) {
  const std::string full = " (ENOSPC: the file system holding " + directory + " is full; free space or write elsewhere)";
  switch (error_number) {
    case ENOSPC:
      return full;
    case EDQUOT:
      return " (EDQUOT: the disk quota on the file system holding " + directory +
             " is used up; free space within the quota or write elsewhere)";
    case EFBIG:
      return " (EFBIG: the process's file size limit (ulimit -f) or the file system's largest file was reached)";
    default:
      break;
  }
  struct statvfs fs_info {};
  if (::statvfs(directory.c_str(), &fs_info) == 0 && fs_info.f_blocks > 0 && fs_info.f_bavail == 0) return full;
  return {};
}

std::string rank_file_path(const std::string& path, int rank, int world_size) {
  if (world_size <= 1 || is_dev_null(path)) return path;
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + ".rank" + std::to_string(rank) + p.extension().string())).string();
}

}  // namespace dp
