// `diffpipe report DIR | FILE...`: the per-rank --report files of a run merged into one table: where each rank's
// denoising time went (busy, transfer, idle), the pipeline's bubble, the bytes on every link, load rates and
// peak memory against the --max-memory caps. The files are untrusted input: every field is checked, and an
// error names the file and the key.
#include <algorithm>
#include <cmath>
#include <optional>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/command.h"
#include "cli/format.h"
#include "core/error.h"
#include "core/json_file.h"

namespace dp::cli {
namespace {

namespace fs = std::filesystem;

// A report file is a few kilobytes; a larger one is not a report.
constexpr uint64_t kMaxReportBytes = uint64_t{4} << 20;
constexpr int kMaxRanks = 65536;

struct RankReport {
  std::string path;
  int rank = 0, world_size = 0;
  std::string run_id, request, role, device, transport, compute_clock;
  nlohmann::json blocks;
  double wall = 0, compute = 0, receive = 0, send = 0, idle = 0, load_seconds = 0;
  uint64_t load_bytes = 0, bytes_sent = 0, bytes_received = 0, peak_resident = 0, peak_device = 0;
  std::optional<int64_t> cap;
  std::vector<int> sends_to;
  int64_t microbatch_steps = 0;
};

double non_negative(const nlohmann::json& doc, const std::string& key, const std::string& path) {
  const double v = json_get<double>(doc, key, path);
  DP_CHECK(std::isfinite(v) && v >= 0, path, ": \"", key, "\" is ", v, ", expected a finite number >= 0");
  return v;
}

uint64_t count(const nlohmann::json& doc, const std::string& key, const std::string& path) {
  const int64_t v = json_get<int64_t>(doc, key, path);
  DP_CHECK(v >= 0, path, ": \"", key, "\" is ", v, ", expected >= 0");
  return static_cast<uint64_t>(v);
}

RankReport read_rank_report(const std::string& path) {
  const nlohmann::json doc = read_json_file(path, kMaxReportBytes);
  require_json_object(doc, path);
  DP_CHECK(json_get_or<std::string>(doc, "format", "", path) == "diffpipe rank report", path,
           ": not a diffpipe rank report (no \"format\": \"diffpipe rank report\"; written by generate --report)");
  RankReport r;
  r.path = path;
  r.run_id = json_get<std::string>(doc, "run_id", path);
  r.request = json_get<std::string>(doc, "request", path);
  r.rank = json_get<int>(doc, "rank", path);
  r.world_size = json_get<int>(doc, "world_size", path);
  DP_CHECK(r.world_size >= 1 && r.world_size <= kMaxRanks, path, ": \"world_size\" ", r.world_size,
           " is out of range");
  DP_CHECK(r.rank >= 0 && r.rank < r.world_size, path, ": \"rank\" ", r.rank, " is outside a world of ", r.world_size);
  r.role = json_get<std::string>(doc, "role", path);
  r.device = json_get<std::string>(doc, "device", path);
  r.transport = json_get<std::string>(doc, "transport", path);
  r.compute_clock = json_get<std::string>(doc, "compute_clock", path);
  r.blocks = doc.contains("blocks") ? doc["blocks"] : nlohmann::json();
  DP_CHECK(r.blocks.is_null() || (r.blocks.is_array() && r.blocks.size() == 2 && r.blocks[0].is_number_integer() &&
                                  r.blocks[1].is_number_integer()),
           path, ": \"blocks\" must be null or [first, last]");
  r.wall = non_negative(doc, "denoise_wall_seconds", path);
  r.compute = non_negative(doc, "compute_seconds", path);
  r.receive = non_negative(doc, "receive_seconds", path);
  r.send = non_negative(doc, "send_seconds", path);
  r.idle = non_negative(doc, "idle_seconds", path);
  r.load_seconds = non_negative(doc, "load_seconds", path);
  r.load_bytes = count(doc, "load_bytes", path);
  r.bytes_sent = count(doc, "bytes_sent", path);
  r.bytes_received = count(doc, "bytes_received", path);
  r.peak_resident = count(doc, "peak_resident_bytes", path);
  r.peak_device = count(doc, "peak_device_bytes", path);
  r.microbatch_steps = static_cast<int64_t>(count(doc, "microbatch_steps", path));
  if (doc.contains("memory_cap_bytes") && !doc["memory_cap_bytes"].is_null())
    r.cap = static_cast<int64_t>(count(doc, "memory_cap_bytes", path));
  for (int to : json_get<std::vector<int>>(doc, "sends_to_ranks", path)) {
    DP_CHECK(to >= 0 && to < r.world_size, path, ": \"sends_to_ranks\" names rank ", to, " outside a world of ",
             r.world_size);
    r.sends_to.push_back(to);
  }
  return r;
}

// Checks that `reports` are the ranks 0..N-1 of one run, once each; throws naming the file that breaks it.
void check_one_run(std::vector<RankReport>& reports, const std::string& source) {
  DP_CHECK(!reports.empty(), source, ": no rank reports (generate --report PATH writes PATH.rankN.json)");
  std::sort(reports.begin(), reports.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  const RankReport& first = reports.front();
  for (const auto& r : reports) {
    DP_CHECK(r.run_id == first.run_id, "mixed runs: ", r.path, " is of run ", r.run_id, ", ", first.path, " of run ",
             first.run_id, " (give the files of one run, or a folder with one run per report name)");
    DP_CHECK(r.request == first.request, "mixed runs: ", r.path, " was asked for another request than ", first.path,
             ":\n  ", r.request, "\n  ", first.request);
    DP_CHECK(r.world_size == first.world_size, "mixed runs: ", r.path, " is of a world of ", r.world_size, ", ",
             first.path, " of ", first.world_size);
  }
  for (size_t i = 1; i < reports.size(); ++i)
    DP_CHECK(reports[i].rank != reports[i - 1].rank, reports[i].path, " and ", reports[i - 1].path, " both are rank ",
             reports[i].rank);
  std::string missing;
  for (int r = 0, i = 0; r < first.world_size; ++r) {
    if (i < static_cast<int>(reports.size()) && reports[static_cast<size_t>(i)].rank == r) ++i;
    else missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  DP_CHECK(missing.empty(), source, ": run ", first.run_id, " has ", first.world_size, " ranks, but the report of rank(s) ",
           missing, " is missing");
}

nlohmann::ordered_json merge(const std::vector<RankReport>& reports) {
  const RankReport& first = reports.front();
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array(), links = nlohmann::ordered_json::array();
  double stage_wall = 0, stage_compute = 0;
  for (const auto& r : reports) {
    const bool stage = !r.blocks.is_null();
    if (stage) {
      stage_wall += r.wall;
      stage_compute += r.compute;
    }
    // On the GPU the device's peak is the one a cap bounds; on the CPU the process's resident set.
    const uint64_t peak = r.device.rfind("cuda", 0) == 0 ? r.peak_device : r.peak_resident;
    ranks.push_back({{"rank", r.rank},
                     {"file", r.path},
                     {"role", r.role},
                     {"device", r.device},
                     {"blocks", r.blocks},
                     {"wall_seconds", r.wall},
                     {"busy_seconds", r.compute},
                     {"transfer_seconds", r.receive + r.send},
                     {"receive_seconds", r.receive},
                     {"send_seconds", r.send},
                     {"idle_seconds", r.idle},
                     {"busy_share", r.wall > 0 ? r.compute / r.wall : 0.0},
                     {"microbatch_steps", r.microbatch_steps},
                     {"load_seconds", r.load_seconds},
                     {"load_bytes", r.load_bytes},
                     {"load_gb_per_s", r.load_seconds > 0 ? r.load_bytes / 1e9 / r.load_seconds : 0.0},
                     {"peak_bytes", peak},
                     {"peak_kind", r.device.rfind("cuda", 0) == 0 ? "device" : "resident"},
                     {"memory_cap_bytes", r.cap ? nlohmann::ordered_json(*r.cap) : nlohmann::ordered_json()},
                     {"peak_over_cap", r.cap ? nlohmann::ordered_json(peak > static_cast<uint64_t>(*r.cap)) : nlohmann::ordered_json()}});
    // A rank's bytes are per rank, not per peer: a link is exact when the rank sends to one peer only.
    nlohmann::ordered_json to = r.sends_to;
    links.push_back({{"from", r.rank}, {"to", to}, {"bytes", r.bytes_sent},
                     {"received_by_peer", r.sends_to.size() == 1
                                              ? nlohmann::ordered_json(reports[static_cast<size_t>(r.sends_to[0])].bytes_received)
                                              : nlohmann::ordered_json()}});
  }
  return {{"run_id", first.run_id},
          {"request", first.request},
          {"world_size", first.world_size},
          {"transport", first.transport},
          {"compute_clock", first.compute_clock},
          // The share of the stage ranks' denoising time not spent computing: waiting for a neighbour,
          // transferring or idle. A perfectly fed pipeline has none.
          {"bubble_share", stage_wall > 0 ? 1.0 - stage_compute / stage_wall : 0.0},
          {"ranks", ranks},
          {"links", links}};
}

void print_run(const nlohmann::ordered_json& run) {
  std::cout << "run " << run["run_id"].get<std::string>() << ": " << run["world_size"].get<int>() << " rank(s), transport "
            << run["transport"].get<std::string>() << ", compute clock " << run["compute_clock"].get<std::string>()
            << "\n  request: " << run["request"].get<std::string>() << "\n";
  std::cout << std::fixed << std::setprecision(2);
  std::cout << "  " << std::left << std::setw(5) << "rank" << std::setw(22) << "role" << std::setw(10) << "blocks"
            << std::right << std::setw(9) << "wall s" << std::setw(9) << "busy s" << std::setw(11) << "transfer s"
            << std::setw(9) << "idle s" << std::setw(7) << "busy" << std::setw(11) << "load GB/s" << std::setw(12)
            << "peak" << std::setw(12) << "cap" << "\n";
  for (const auto& r : run["ranks"]) {
    const auto& b = r["blocks"];
    const std::string blocks = b.is_null() ? "-" : str("[", b[0].get<int>(), ",", b[1].get<int>(), ")");
    const std::string cap = r["memory_cap_bytes"].is_null() ? "-" : human_bytes(r["memory_cap_bytes"].get<uint64_t>());
    std::cout << "  " << std::left << std::setw(5) << r["rank"].get<int>() << std::setw(22)
              << r["role"].get<std::string>() << std::setw(10) << blocks << std::right << std::setw(9)
              << r["wall_seconds"].get<double>() << std::setw(9) << r["busy_seconds"].get<double>() << std::setw(11)
              << r["transfer_seconds"].get<double>() << std::setw(9) << r["idle_seconds"].get<double>() << std::setw(6)
              << std::setprecision(0) << 100 * r["busy_share"].get<double>() << "%" << std::setprecision(2)
              << std::setw(11) << r["load_gb_per_s"].get<double>() << std::setw(12)
              << human_bytes(r["peak_bytes"].get<uint64_t>()) << std::setw(12) << cap
              << (r["peak_over_cap"] == true ? "  OVER CAP" : "") << "\n";
  }
  std::cout << "  bubble: " << std::setprecision(1) << 100 * run["bubble_share"].get<double>()
            << "% of the stage ranks' denoising time not computing (waiting, transferring, idle)\n";
  for (const auto& l : run["links"]) {
    std::string to;
    for (const auto& t : l["to"]) to += (to.empty() ? "" : ",") + std::to_string(t.get<int>());
    std::cout << "  link " << l["from"].get<int>() << " -> " << to << ": " << human_bytes(l["bytes"].get<uint64_t>());
    if (!l["received_by_peer"].is_null() && l["received_by_peer"] != l["bytes"])
      std::cout << " (rank " << to << " counts " << human_bytes(l["received_by_peer"].get<uint64_t>()) << " received)";
    std::cout << "\n";
  }
}

// A folder: its *.rankN.json files, one run per report name (PATH of --report PATH).
std::map<std::string, std::vector<std::string>> reports_in_folder(const std::string& dir) {
  static const std::regex rank_file(R"((.+)\.rank([0-9]+)\.json)");
  std::map<std::string, std::vector<std::string>> runs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, m, rank_file)) runs[m[1].str()].push_back(entry.path().string());
  }
  DP_CHECK(!runs.empty(), dir, ": no rank reports (*.rankN.json, written by generate --report PATH on N > 1 ranks)");
  return runs;
}

void run_report(const std::vector<std::string>& inputs, bool as_json) {
  DP_CHECK(!inputs.empty(), "report needs a folder or the rank report files of one run");
  std::vector<std::pair<std::string, std::vector<std::string>>> runs;  // (source, files)
  std::vector<std::string> files;
  for (const auto& input : inputs) {
    if (fs::is_directory(input)) {
      for (auto& [name, paths] : reports_in_folder(input)) {
        std::sort(paths.begin(), paths.end());
        runs.emplace_back(str(input, " (", name, ")"), paths);
      }
    } else {
      DP_CHECK(fs::exists(input), input, ": no such file or folder");
      files.push_back(input);
    }
  }
  // Files named one by one are one run together: that is where mixing runs would go unseen.
  if (!files.empty()) runs.emplace_back(files.size() == 1 ? files[0] : "the files given", files);
  nlohmann::ordered_json merged = nlohmann::ordered_json::array();
  for (const auto& [source, paths] : runs) {
    std::vector<RankReport> reports;
    for (const auto& p : paths) reports.push_back(read_rank_report(p));
    check_one_run(reports, source);
    merged.push_back(merge(reports));
  }
  if (as_json) {
    std::cout << nlohmann::ordered_json{{"runs", merged}}.dump(2) << "\n";
    return;
  }
  for (size_t i = 0; i < merged.size(); ++i) {
    if (i) std::cout << "\n";
    print_run(merged[i]);
  }
}

CommandRegistrar registrar("report", 55, [](CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "report", "Merge the per-rank generate --report files of a run into one table: busy, transfer and idle time "
                "per rank, the pipeline bubble, bytes per link, load GB/s and peak memory against the caps");
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto as_json = std::make_shared<bool>(false);
  cmd->add_option("inputs", *inputs,
                  "a folder (every PATH.rankN.json in it, one run per PATH) or the report files of one run; files of "
                  "different runs together are refused")
      ->required();
  cmd->add_flag("--json", *as_json, "print one JSON object ({\"runs\": [...]}) instead of tables");
  cmd->callback([inputs, as_json] { run_report(*inputs, *as_json); });
});

}  // namespace
}  // namespace dp::cli
