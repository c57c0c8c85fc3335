#include "runtime/rank_report.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/json_file.h"
#include "core/log.h"
#include "core/memory_stats.h"
#include "core/output_policy.h"
#include "io/parallel_load.h"
#include "pipeline/device_stats.h"
#include "placement/plan.h"
#include "runtime/world.h"

namespace dp::runtime {
namespace {

std::string rank_report_path(const std::string& path, const World& world) {
  return rank_file_path(path, world.rank(), world.size());  // core/output_policy.h: generate checks it at start
}

// This rank's --max-memory budget (GPU d of the map is stage group d), or null when none was given: the cap its
// peak memory is read against.
nlohmann::ordered_json memory_cap(const RunContext& run) {
  if (run.options.max_memory.empty()) return nullptr;
  const auto caps = placement::read_max_memory_argument(run.options.max_memory);
  const auto gpu = placement::Device::gpu(run.layout().group_of(run.world.rank()));
  if (!caps.has(gpu)) return nullptr;
  return caps.at(gpu);
}

}  // namespace

void write_rank_report(const RunContext& run, const RankFigures& figures) {
  const auto& options = run.options;
  if (options.report_path.empty()) return;
  const World& world = run.world;
  const MeshLayout& layout = run.layout();
  const at::Device& device = run.device;
  const Transport* transport = run.transport.get();
  const RankTimes& times = figures.times;
  const models::OffloadStats& offload = figures.offload;
  const placement::RankStage* stage = layout.stage_of(world.rank());
  nlohmann::ordered_json doc = {
      {"format", "diffpipe rank report"},
      {"run_id", run.run_id},
      {"request", run.request_summary},
      {"rank", world.rank()},
      {"world_size", world.size()},
      {"host", world.host()},
      {"local_rank", world.local_rank()},
      {"device", device.str()},
      {"transport", run.transport_name},
      // Which clock the seconds below are on: CUDA events (device time) or the host's.
      {"compute_clock", device.is_cuda() ? "device" : "host"},
      {"transfer_clock", transport && transport->times_transfers_on_device() ? "device" : "host"},
      {"role", world.is_coordinator() ? (stage ? "coordinator and stage" : "coordinator") : (stage ? "stage" : "idle")},
      {"blocks", stage ? nlohmann::ordered_json::array({stage->first_block, stage->last_block}) : nlohmann::ordered_json()},
      {"load_seconds", figures.load_seconds},
      {"load_bytes", figures.load_bytes},
      {"load_gb_per_s", figures.load_seconds > 0 ? figures.load_bytes / 1e9 / figures.load_seconds : 0.0},
      {"peak_resident_bytes", peak_resident_bytes()},
      {"peak_device_bytes", device.is_cuda() ? pipeline::peak_memory_bytes(device) : 0},
      {"peak_device_reserved_bytes", pipeline::peak_reserved_bytes(device)},
      {"memory_cap_bytes", memory_cap(run)},
      {"receives_from", world.is_coordinator() ? layout.last_rank() : layout.previous(world.rank())},
      {"sends_to", world.is_coordinator() ? (layout.coordinator_runs_first_stage() ? layout.next(0) : layout.first_rank())
                                          : layout.next(world.rank())},
      {"bytes_sent", transport ? transport->bytes_sent() : 0},
      {"bytes_received", transport ? transport->bytes_received() : 0},
      {"denoise_wall_seconds", times.wall_seconds},
      {"compute_seconds", times.compute_seconds},
      {"receive_seconds", times.wait_seconds},
      {"send_seconds", times.send_seconds},
      {"host_wait_seconds", times.host_wait_seconds},
      {"idle_seconds", std::max(0.0, times.wall_seconds - times.compute_seconds - times.wait_seconds - times.send_seconds)},
      {"microbatch_steps", times.steps},
      // Offloaded blocks this rank streamed to its GPU (all zero when it holds none, or on CPU).
      {"offloaded_blocks", offload.blocks},
      {"offload_copies", offload.copies},
      {"offload_bytes", offload.bytes},
      {"offload_copy_seconds", offload.copy_seconds},
      {"offload_pinned_host_bytes", offload.host_bytes}};
  // The mesh: this rank's stage group and token shard, every rank it sends to and receives from (the coordinator
  // scatters to and gathers from K), and its group's all-to-alls (inside compute_seconds).
  const int rank = world.rank();
  nlohmann::ordered_json sends_to = nlohmann::ordered_json::array(), receives_from = nlohmann::ordered_json::array();
  if (world.is_coordinator()) {
    for (int r : layout.first_ranks()) sends_to.push_back(r == 0 ? layout.next(0) : r);
    for (int r : layout.last_ranks()) receives_from.push_back(r);
  } else {
    sends_to.push_back(layout.next(rank));
    receives_from.push_back(layout.previous(rank));
  }
  doc["sends_to_ranks"] = sends_to;
  doc["receives_from_ranks"] = receives_from;
  doc["mesh"] = {{"stage_groups", layout.shape().stages},
                 {"sequence_parallel", layout.sequence_parallel()},
                 {"stage_group", layout.group_of(rank)},
                 {"shard", layout.shard_of(rank)},
                 {"group_ranks", layout.group_ranks(rank)},
                 {"text_tokens", {layout.text_shard(layout.shard_of(rank)).first, layout.text_shard(layout.shard_of(rank)).count}},
                 {"image_tokens", {layout.image_shard(layout.shard_of(rank)).first, layout.image_shard(layout.shard_of(rank)).count}}};
  doc["all_to_all"] = {{"calls", times.exchanges},
                       {"bytes_sent", transport ? transport->exchange_bytes_sent() : 0},
                       {"bytes_received", transport ? transport->exchange_bytes_received() : 0},
                       {"seconds", times.exchange_seconds},
                       {"clock", transport && transport->times_transfers_on_device() ? "device" : "host"}};
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (size_t s = 0; s < times.per_step.size(); ++s) {
    const auto& step = times.per_step[s];
    steps.push_back({{"step", s + 1}, {"microbatches", step.microbatches}, {"compute_seconds", step.compute_seconds},
                     {"receive_seconds", step.receive_seconds}, {"send_seconds", step.send_seconds},
                     {"all_to_all_seconds", step.exchange_seconds}});
  }
  doc["per_step"] = steps;
  // Step 1 against the median later step (compute time): what first use still costs inside the loop.
  std::vector<double> later;
  for (size_t s = 1; s < times.per_step.size(); ++s) later.push_back(times.per_step[s].compute_seconds);
  std::sort(later.begin(), later.end());
  const double steady = later.empty() ? 0.0 : later[later.size() / 2];
  doc["steady_step_compute_seconds"] = steady;
  doc["first_step_ratio"] = steady > 0 && !times.per_step.empty() ? times.per_step.front().compute_seconds / steady : 0.0;
  doc["load_overlap"] = {{"on", run.load_overlapped}, {"reason", run.load_overlap_reason}};
  doc["loads"] = io::load_figures_json(io::load_history());
  const std::string path = rank_report_path(options.report_path, world);
  write_json_file(path, doc);
  DP_INFO("rank ", world.rank(), ": wrote ", path);
}

}  // namespace dp::runtime
