#include "cli/generate_paths.h"

#include <filesystem>

#include "core/error.h"
#include "core/output_policy.h"
#include "io/checkpoint_dir.h"
#include "io/checkpoint_file.h"
#include "io/embeddings_cache_file.h"

namespace dp::cli {
namespace {

// check_output_path, with the option that named the path in front of its message.
void check_output_option(const std::string& option, const std::string& path) {
  try {
    check_output_path(path);
  } catch (const Error& e) {
    throw Error(str(option, " ", e.what()), e.file(), e.line());
  }
}

}  // namespace

void check_generate_paths(const GeneratePaths& p) {
  using Use = RunPath::Use;
  const bool coordinator = p.rank == 0;
  // What each rank writes: rank 0 the results, the cache and the checkpoints; every rank its report.
  if (coordinator) {
    for (const auto& path : p.outputs)
      check_output_option(p.outputs.size() > 1 ? "--out (image file " + path + ")" : "--out", path);
    if (!p.report_json.empty()) check_output_option("--report-json", p.report_json);
    if (!p.torch_profile.empty()) check_output_option("--torch-profile", p.torch_profile);
    if (!p.embeddings_cache.empty()) {
      check_output_option("--embeddings-cache", p.embeddings_cache);
      io::check_embeddings_cache_target(p.embeddings_cache);
    }
  }
  if (!p.report.empty()) {
    const std::string mine = rank_file_path(p.report, p.rank, p.world_size);
    check_output_option(mine == p.report ? "--report" : "--report (rank " + std::to_string(p.rank) + "'s file)", mine);
  }

  // One file under two names, or a write into a folder the run reads: refused on every rank alike.
  std::vector<RunPath> uses;
  for (const auto& path : p.outputs) uses.push_back({"--out", path, Use::output});
  uses.push_back({"--report-json", p.report_json, Use::output});
  uses.push_back({"--torch-profile", p.torch_profile, Use::output});
  if (!p.report.empty())
    for (int r = 0; r < p.world_size; ++r)
      uses.push_back({p.world_size > 1 ? "--report (rank " + std::to_string(r) + ")" : "--report",
                      rank_file_path(p.report, r, p.world_size), Use::output});
  uses.push_back({"--embeddings-cache", p.embeddings_cache, Use::input_output});
  uses.push_back({"--checkpoint-dir", p.checkpoint_dir, Use::output_folder});
  uses.push_back({"--resume", p.resume_file, Use::input});
  uses.push_back({"--prompts-file", p.prompts_file, Use::input});
  uses.push_back({"--config", p.config, Use::input});
  uses.push_back({"--model", p.model, Use::input_folder});
  check_distinct_paths(uses);

  if (!coordinator || p.checkpoint_dir.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(p.checkpoint_dir, ec);
  DP_CHECK(!ec, "--checkpoint-dir ", p.checkpoint_dir, ": cannot create it (", ec.message(), ")");
  check_output_option("--checkpoint-dir", (fs::path(p.checkpoint_dir) / io::checkpoint_file_name(0, p.run_id)).string());
  io::check_checkpoint_dir_for_run(p.checkpoint_dir, p.run_id, p.may_share_checkpoint_dir);
}

}  // namespace dp::cli
