#include "runtime/trace_file.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/json_file.h"
#include "core/log.h"
#include "core/output_policy.h"
#include "core/trace.h"
#include "runtime/run_context.h"
#include "runtime/world.h"

namespace dp::runtime {
namespace {

constexpr trace::Track kTracks[] = {trace::Track::host, trace::Track::compute, trace::Track::send,
                                    trace::Track::receive, trace::Track::checkpoint, trace::Track::device_send,
                                    trace::Track::device_receive, trace::Track::background_load};

// What a rank sends rank 0: who it is and its spans on its own clock.
std::string rank_payload(const RunContext& run) {
  const placement::RankStage* stage = run.layout().stage_of(run.world.rank());
  std::string label = str("rank ", run.world.rank(), " (", run.world.host(), ", ", run.device.str());
  if (stage) label += str(", blocks [", stage->first_block, ",", stage->last_block, ")");
  label += ")";
  nlohmann::json payload = {{"rank", run.world.rank()}, {"label", label}};
  payload["spans"] = nlohmann::json::parse(trace::take_spans_json());
  return payload.dump();
}

nlohmann::json metadata(const char* name, int pid, int tid, const nlohmann::json& args) {
  return {{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"ts", 0}, {"args", args}};
}

nlohmann::json merge(const RunContext& run, const std::vector<std::string>& payloads,
                     const std::vector<World::ClockOffset>& offsets) {
  std::vector<nlohmann::json> ranks;
  int64_t earliest = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < payloads.size(); ++r) {
    ranks.push_back(nlohmann::json::parse(payloads[r]));
    const auto offset = static_cast<int64_t>(std::llround(offsets[r].offset_us));
    for (auto& span : ranks.back()["spans"]) {
      span["ts"] = span["ts"].get<int64_t>() - offset;  // on rank 0's clock
      earliest = std::min(earliest, span["ts"].get<int64_t>());
    }
  }
  if (earliest == std::numeric_limits<int64_t>::max()) earliest = 0;
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json alignment = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int pid = static_cast<int>(r);
    events.push_back(metadata("process_name", pid, 0, {{"name", ranks[r]["label"]}}));
    events.push_back(metadata("process_sort_index", pid, 0, {{"sort_index", pid}}));
    for (trace::Track track : kTracks) {
      events.push_back(metadata("thread_name", pid, static_cast<int>(track), {{"name", trace::track_name(track)}}));
      events.push_back(metadata("thread_sort_index", pid, static_cast<int>(track), {{"sort_index", static_cast<int>(track)}}));
    }
    // Parents before children when two spans start together, so that viewers nest them.
    auto& spans = ranks[r]["spans"];
    std::stable_sort(spans.begin(), spans.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      const auto ta = a["ts"].get<int64_t>(), tb = b["ts"].get<int64_t>();
      return ta != tb ? ta < tb : a["dur"].get<int64_t>() > b["dur"].get<int64_t>();
    });
    for (const auto& span : spans)
      events.push_back({{"name", span["name"]},
                        {"cat", trace::track_name(static_cast<trace::Track>(span["track"].get<int>()))},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", span["track"]},
                        {"ts", span["ts"].get<int64_t>() - earliest},
                        {"dur", span["dur"]}});
    alignment.push_back({{"rank", pid}, {"offset_us", offsets[r].offset_us}, {"round_trip_us", offsets[r].round_trip_us}});
  }
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"tool", "diffpipe generate --trace"},
            {"run_id", run.run_id},
            {"request", run.request_summary},
            {"clock", "each rank's steady clock, shifted onto rank 0's by a ping-pong at the end of the run (the "
                      "error of each offset is at most half its round trip); compute spans on CUDA are CUDA-event "
                      "device times placed through one reference event"},
            {"clock_alignment", alignment}}}};
}

}  // namespace

void start_trace(const RunContext& run) {
  if (run.options.trace_path.empty()) return;
  if (run.world.is_coordinator()) check_output_path(run.options.trace_path);
  trace::start();
}

void write_trace(const RunContext& run) {
  if (run.options.trace_path.empty()) return;
  const double timeout = run.options.transport_timeout_seconds;
  const auto offsets = run.world.clock_offsets_to_coordinator(timeout);
  const auto payloads = run.world.gather_to_coordinator(rank_payload(run), "trace events", timeout);
  if (!run.world.is_coordinator()) return;
  write_json_file(run.options.trace_path, merge(run, payloads, offsets));
  DP_INFO("wrote trace ", run.options.trace_path, " (", payloads.size(), " rank(s); open it in https://ui.perfetto.dev "
          "or chrome://tracing)");
}

}  // namespace dp::runtime
