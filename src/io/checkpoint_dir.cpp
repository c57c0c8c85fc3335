#include "io/checkpoint_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/log.h"

namespace dp::io {
namespace {

namespace fs = std::filesystem;

struct ParsedName {
  int step = -1;
  std::string run_id;  // empty for a version 1 name
};

// checkpoint-stepNNNNNN-RUNID.h5, or checkpoint-stepNNNNNN.h5 (format version 1); step -1 for other names.
ParsedName parse_name(const std::string& name) {
  static const std::string prefix = "checkpoint-step";
  ParsedName parsed;
  if (name.rfind(prefix, 0) != 0 || name.size() < prefix.size() + 4 || name.substr(name.size() - 3) != ".h5")
    return parsed;
  std::string middle = name.substr(prefix.size(), name.size() - prefix.size() - 3);
  const auto dash = middle.find('-');
  std::string digits = middle.substr(0, dash);
  if (dash != std::string::npos) {
    const std::string id = middle.substr(dash + 1);
    if (!is_run_id(id)) return parsed;
    parsed.run_id = id;
  }
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
    return parsed;
  parsed.step = std::stoi(digits);
  return parsed;
}

std::string file_name(const std::string& path) { return fs::path(path).filename().string(); }

// Entries grouped by run, in order of their first appearance.
std::vector<std::vector<const CheckpointEntry*>> group_by_run(const std::vector<CheckpointEntry>& entries) {
  std::vector<std::vector<const CheckpointEntry*>> groups;
  std::map<std::string, size_t> index;
  for (const auto& e : entries) {
    if (!e.problem.empty()) continue;
    const auto [it, added] = index.emplace(e.run_key(), groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(&e);
  }
  return groups;
}

std::string prompts_text(const std::vector<std::string>& prompts) {
  std::string text;
  for (size_t i = 0; i < prompts.size() && i < 2; ++i) {
    std::string p = prompts[i].size() > 40 ? prompts[i].substr(0, 37) + "..." : prompts[i];
    text += str(i ? ", " : "", "\"", p, "\"");
  }
  if (prompts.size() > 2) text += ", ...";
  return text;
}

}  // namespace

std::string CheckpointEntry::run_key() const {
  if (!header.run_id.empty()) return header.run_id;
  return "v1 request " + header.request_fingerprint + " model " + header.model_fingerprint;
}

std::vector<CheckpointEntry> scan_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  DP_CHECK(fs::is_directory(dir, ec), dir, ": no such checkpoint directory");
  std::vector<CheckpointEntry> entries;
  for (const auto& item : fs::directory_iterator(dir)) {
    const std::string name = item.path().filename().string();
    const ParsedName parsed = parse_name(name);
    if (parsed.step < 0) continue;
    CheckpointEntry e;
    e.path = item.path().string();
    e.step = parsed.step;
    struct stat st {};
    if (::lstat(e.path.c_str(), &st) != 0) continue;  // gone meanwhile
    if (S_ISLNK(st.st_mode)) {
      e.problem = "a symbolic link, not a checkpoint diffpipe wrote";
    } else if (!S_ISREG(st.st_mode)) {
      e.problem = "not a regular file";
    } else {
      try {
        e.header = read_checkpoint_header(e.path);
        if (e.header.run_id != parsed.run_id)
          e.problem = str("its name says run '", parsed.run_id, "' but it holds run '", e.header.run_id, "'");
      } catch (const Error& error) {
        e.problem = error.what();
      }
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return entries;
}

std::string describe_run(const std::vector<const CheckpointEntry*>& entries) {
  if (entries.empty()) return "(no checkpoint)";
  const Checkpoint& h = entries.back()->header;
  std::string steps;
  for (const auto* e : entries) steps += str(steps.empty() ? "" : ", ", e->step);
  const std::string who = h.run_id.empty() ? "a run of format version 1 (no run id)" : "run " + h.run_id;
  return str(who, ": step", entries.size() > 1 ? "s " : " ", steps, " (newest ", file_name(entries.back()->path),
             "); ", h.run.prompts.size(), " prompt(s) ", prompts_text(h.run.prompts), " x ", h.run.num_images_per_prompt,
             ", ", h.run.width, "x", h.run.height, ", ", h.run.steps, " steps, seed ", h.run.seed, ", ", h.run.dtype,
             h.run.fp8_gemms() ? " with --fp8-gemms" : "");
}

void check_checkpoint_dir_for_run(const std::string& dir, const std::string& run_id, bool may_share) {
  if (may_share) return;
  const auto entries = scan_checkpoint_dir(dir);
  std::vector<CheckpointEntry> foreign;
  for (const auto& e : entries)
    if (!e.problem.empty() || e.run_key() != run_id) foreign.push_back(e);
  if (foreign.empty()) return;
  std::string listing;
  for (const auto& group : group_by_run(foreign)) listing += "\n  " + describe_run(group);
  for (const auto& e : foreign)
    if (!e.problem.empty()) listing += str("\n  ", file_name(e.path), ": ", e.problem);
  DP_FAIL("--checkpoint-dir ", dir, " holds checkpoints of another run:", listing,
          "\nA run does not write into another run's checkpoint folder unless told to: resume one of them with "
          "--resume ", dir, ", choose another --checkpoint-dir, or give --share-checkpoint-dir to write beside "
          "them (their files are never replaced or removed)");
}

std::string select_resume_checkpoint(const std::string& dir, const ResumeRequest& request) {
  const auto entries = scan_checkpoint_dir(dir);
  for (const auto& e : entries)
    if (!e.problem.empty()) DP_WARN("--resume: skipping ", e.path, ": ", e.problem);
  const auto groups = group_by_run(entries);
  DP_CHECK(!groups.empty(), "--resume ", dir, ": no valid checkpoint (", entries.size(),
           " checkpoint-step*.h5 entr", entries.size() == 1 ? "y" : "ies", ")");
  std::vector<size_t> matching;
  std::string differences;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Checkpoint& h = groups[g].back()->header;
    std::string why;
    if (h.model_fingerprint != request.model_fingerprint)
      why = str("another model (transformer fingerprint ", h.model_fingerprint, ")");
    for (const auto& d : compare_runs(h.run, request.run, request.given))
      why += str(why.empty() ? "" : "; ", "--", d.field, " ", d.in_checkpoint, ", this run ", d.in_run);
    if (why.empty()) matching.push_back(g);
    else differences += str("\n  ", describe_run(groups[g]), "\n    differs: ", why);
  }
  size_t chosen = 0;
  if (matching.size() == 1) {
    chosen = matching.front();
  } else if (matching.empty() && groups.size() == 1) {
    chosen = 0;  // the caller's own comparison names the difference, as for --resume FILE
  } else if (matching.empty()) {
    DP_FAIL("--resume ", dir, " holds checkpoints of ", groups.size(), " runs and none matches this request:",
            differences, "\nName the checkpoint to resume (--resume ", dir, "/checkpoint-step...h5), or give the "
            "options of the run to continue");
  } else {
    std::string listing;
    for (size_t g : matching) listing += "\n  " + describe_run(groups[g]);
    DP_FAIL("--resume ", dir, " holds checkpoints of ", matching.size(), " runs that this request matches:", listing,
            "\nName the checkpoint to resume (--resume ", dir, "/checkpoint-step...h5), or give the options "
            "(--prompt, --seed, --steps ...) that single one run out");
  }
  const auto& group = groups[chosen];
  std::string reasons;
  for (auto it = group.rbegin(); it != group.rend(); ++it) {
    try {
      read_checkpoint((*it)->path);
      return (*it)->path;
    } catch (const Error& e) {
      DP_WARN("--resume: skipping ", (*it)->path, ": ", e.what());
      reasons += str("\n  ", e.what());
    }
  }
  DP_FAIL("--resume ", dir, ": no valid checkpoint of ", describe_run(group), reasons);
}

std::vector<std::string> prune_run_checkpoints(const std::string& dir, const std::string& run_id, int keep) {
  DP_CHECK(keep >= 1, "--keep-checkpoints must be at least 1, got ", keep);
  DP_CHECK(is_run_id(run_id), "rotation of run '", run_id, "': not a run id");
  std::vector<std::pair<int, std::string>> own;
  std::vector<std::string> temporaries;
  const std::string temporary_mark = "-" + run_id + ".h5.";
  for (const auto& item : fs::directory_iterator(dir)) {
    const std::string name = item.path().filename().string();
    struct stat st {};
    if (::lstat(item.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // links and the like: never
    // Temporaries of this run's writers killed before their rename (".checkpoint-step...-RUNID.h5.XXXXXX.partial").
    if (name.rfind(".checkpoint-step", 0) == 0 && name.find(temporary_mark) != std::string::npos &&
        name.size() > 8 && name.substr(name.size() - 8) == ".partial") {
      temporaries.push_back(item.path().string());
      continue;
    }
    const ParsedName parsed = parse_name(name);
    if (parsed.step < 0 || parsed.run_id != run_id) continue;
    // The name says this run; the file must say so too before it is removed.
    try {
      if (read_checkpoint_header(item.path().string()).run_id != run_id) continue;
    } catch (const Error&) {
      continue;  // unreadable: not provably this run's
    }
    own.emplace_back(parsed.step, item.path().string());
  }
  std::sort(own.begin(), own.end());
  std::vector<std::string> removed;
  const auto remove = [&](const std::string& path, const std::string& what) {
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) {
      DP_WARN(path, ": cannot remove ", what, " (", ec.message(), ")");
      return;
    }
    DP_INFO("checkpoint rotation: removed ", path, " (", what, ")");
    removed.push_back(path);
  };
  for (size_t i = 0; i + static_cast<size_t>(keep) < own.size(); ++i)
    remove(own[i].second, str("step ", own[i].first, " of this run ", run_id, "; the newest ", keep, " are kept"));
  for (const auto& path : temporaries) remove(path, str("a temporary of this run ", run_id, " left by a killed writer"));
  return removed;
}

}  // namespace dp::io
