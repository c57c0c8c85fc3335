#include "io/hub_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace dp::io {
namespace fs = std::filesystem;
namespace {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

bool is_id_part(const std::string& part) {
  if (part.empty() || part.size() > 96 || part.front() == '.' || part.front() == '-') return false;
  for (char c : part) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return part.find("..") == std::string::npos;
}

// A branch, tag or commit as one path component: refs may be nested ("refs/pr/1"), so '/' is allowed inside,
// but never a component that climbs out.
bool is_safe_revision(const std::string& revision) {
  if (revision.empty() || revision.front() == '/') return false;
  for (const auto& part : fs::path(revision)) {
    if (part == ".." || part == "." || part.empty()) return false;
  }
  return true;
}

std::string read_first_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\n')) line.pop_back();
  return line;
}

std::string download_hint(const std::string& id, const std::string& revision) {
  const std::string rev = revision.empty() ? std::string() : " --revision " + revision;
  return str("download it first (no network is used here): `huggingface-cli download ", id, rev,
             "` (or huggingface_hub.snapshot_download(\"", id, "\")); a gated model such as FLUX.1-dev also needs "
             "`huggingface-cli login` and its licence accepted at https://huggingface.co/", id,
             "; or pass the folder of a download made with --local-dir DIR");
}

}  // namespace

std::string hub_cache_dir() {
  if (const auto cache = environment("HF_HUB_CACHE"); !cache.empty()) return cache;
  if (const auto home = environment("HF_HOME"); !home.empty()) return (fs::path(home) / "hub").string();
  if (const auto xdg = environment("XDG_CACHE_HOME"); !xdg.empty())
    return (fs::path(xdg) / "huggingface" / "hub").string();
  return (fs::path(environment("HOME")) / ".cache" / "huggingface" / "hub").string();
}

bool looks_like_hub_id(const std::string& model) {
  const auto slash = model.find('/');
  if (slash == std::string::npos || model.find('/', slash + 1) != std::string::npos) return false;
  return is_id_part(model.substr(0, slash)) && is_id_part(model.substr(slash + 1));
}

std::string resolve_model_argument(const std::string& model, const std::string& revision) {
  std::error_code ec;
  if (fs::is_directory(model, ec)) {
    DP_CHECK(revision.empty(), "--revision ", revision, " applies to a Hugging Face model id, but --model ", model,
             " is a local folder");
    return model;
  }
  if (!looks_like_hub_id(model)) {
    DP_CHECK(revision.empty(), "--revision ", revision, " applies to a Hugging Face model id (ORG/NAME), but --model ",
             model, " is not one");
    return model;
  }
  const std::string wanted = revision.empty() ? "main" : revision;
  DP_CHECK(is_safe_revision(wanted), "--revision '", revision, "': expected a branch, tag or commit hash");
  const std::string cache = hub_cache_dir();
  const fs::path repo = fs::path(cache) / ("models--" + model.substr(0, model.find('/')) + "--" +
                                           model.substr(model.find('/') + 1));
  DP_CHECK(fs::is_directory(repo, ec), "--model ", model, ": not a local folder, and not in the Hugging Face cache ",
           cache, " (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub): ", download_hint(model, revision));
  // A branch or tag names a commit in refs/; a commit hash names its snapshot directly.
  std::string commit = wanted;
  if (fs::is_regular_file(repo / "refs" / wanted, ec)) commit = read_first_line(repo / "refs" / wanted);
  DP_CHECK(is_safe_revision(commit), repo.string(), "/refs/", wanted, ": not a commit hash ('", commit, "')");
  const fs::path snapshot = repo / "snapshots" / commit;
  DP_CHECK(fs::is_directory(snapshot, ec), "--model ", model, ": revision ", wanted,
           commit != wanted ? " (commit " + commit + ")" : std::string(), " is not in the Hugging Face cache (",
           repo.string(), "/snapshots has no such folder): ", download_hint(model, revision));
  return snapshot.string();
}

}  // namespace dp::io
