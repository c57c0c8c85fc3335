#include "placement/stage_timing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "placement/custom_device_map.h"
#include "placement/mesh.h"

namespace dp::placement {
namespace {

int64_t image_tokens(int64_t height, int64_t width) {
  DP_CHECK(height > 0 && width > 0 && height % 16 == 0 && width % 16 == 0, "resolution ", height, "x", width,
           " must be positive multiples of 16 (VAE factor 8 times the 2x2 latent packing)");
  return (height / 16) * (width / 16);
}

// The tokens of one rank of a group of k: the longest image and text shards (mesh.h), all of them for k = 1.
int64_t rank_share(int64_t tokens, int k) {
  DP_CHECK(k >= 1, "--sequence-parallel must be at least 1, got ", k);
  return token_shard(tokens, k, 0).count;
}

// Linear layers: 2 FLOPs per multiply-add. Per token both block kinds do 12 d^2 multiply-adds (double:
// qkv 3 + out 1 + MLP 8 per stream; single: qkv 3 + MLP in 4 + fused out 5), and attention over the joint
// sequence does 2 L^2 d. The modulation linears run on one token. One rank of k: the header says how it splits.
double block_flops(const models::FluxConfig& c, int64_t height, int64_t width, int64_t text_tokens, int modulation,
                   int k) {
  const double d = static_cast<double>(c.inner_dim());
  const int64_t image = image_tokens(height, width);
  const double tokens = static_cast<double>(image + text_tokens);
  const double rank_tokens = static_cast<double>(rank_share(image, k) + rank_share(text_tokens, k));
  return 24.0 * d * d * rank_tokens + 4.0 * tokens * tokens * d / k + 2.0 * modulation * d * d;
}

// x_embedder and context_embedder run on the rank's shards; the timestep, guidance and pooled-text embedders
// on one vector each, on every rank.
double embedder_flops(const models::FluxConfig& c, int64_t height, int64_t width, int64_t text_tokens, int k) {
  const double d = static_cast<double>(c.inner_dim());
  const double img = static_cast<double>(rank_share(image_tokens(height, width), k));
  const int64_t text = rank_share(text_tokens, k);
  const double patch_in = static_cast<double>(c.in_channels * c.patch_size * c.patch_size);
  const double embedders = c.guidance_embeds ? 2.0 : 1.0;
  return 2.0 * img * patch_in * d + 2.0 * text * c.joint_attention_dim * d +
         embedders * 2.0 * (256.0 * d + d * d) + 2.0 * (c.pooled_projection_dim * d + d * d);
}

// norm_out's modulation on temb (every rank), proj_out on the rank's image shard.
double output_flops(const models::FluxConfig& c, int64_t height, int64_t width, int k) {
  const double d = static_cast<double>(c.inner_dim());
  const double img = static_cast<double>(rank_share(image_tokens(height, width), k));
  const double out = static_cast<double>(c.patch_size * c.patch_size * c.output_channels());
  return 2.0 * d * 2.0 * d + 2.0 * img * d * out;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

bool under(const std::string& tensor, const std::string& module) {
  return tensor == module || (starts_with(tensor, module) && tensor.size() > module.size() && tensor[module.size()] == '.');
}

}  // namespace

double double_block_flops(const models::FluxConfig& config, int64_t height, int64_t width, int64_t text_tokens,
                          int sequence_parallel) {
  return block_flops(config, height, width, text_tokens, 12, sequence_parallel);
}

double single_block_flops(const models::FluxConfig& config, int64_t height, int64_t width, int64_t text_tokens,
                          int sequence_parallel) {
  return block_flops(config, height, width, text_tokens, 3, sequence_parallel);
}

std::vector<TimedUnit> flux_timed_units(const models::FluxConfig& c, const ModuleTree& tree, const TimingModel& t) {
  DP_CHECK(t.batch > 0, "batch must be positive, got ", t.batch);
  const double batch = static_cast<double>(t.batch);
  const int k = t.sequence_parallel;
  const double fd = double_block_flops(c, t.height, t.width, t.text_tokens, k) * batch;
  const double fs = single_block_flops(c, t.height, t.width, t.text_tokens, k) * batch;
  // ms per FLOP for blocks of each kind, and for the small layers (calibrated on double blocks when measured).
  double double_ms_per_flop = 1e3 / (t.sustained_tflops * 1e12);
  double single_ms_per_flop = double_ms_per_flop;
  if (t.measured()) {
    DP_CHECK(*t.double_block_ms > 0 && *t.single_block_ms > 0, "measured block times must be positive, got ",
             *t.double_block_ms, " and ", *t.single_block_ms, " ms");
    double_ms_per_flop = *t.double_block_ms / double_block_flops(c, t.measured_height, t.measured_width, t.text_tokens);
    single_ms_per_flop = *t.single_block_ms / single_block_flops(c, t.measured_height, t.measured_width, t.text_tokens);
  } else {
    DP_CHECK(t.sustained_tflops > 0, "sustained TFLOP/s must be positive, got ", t.sustained_tflops);
  }
  // Calibrated: each kind's ms per FLOP from its measured time at this very shape and microbatch (K = 1), so a
  // rank's share at K > 1 scales by the FLOPs of the share.
  double embedders_ms_per_flop = double_ms_per_flop, output_ms_per_flop = double_ms_per_flop;
  if (t.calibrated) {
    const CalibratedTimes& m = *t.calibrated;
    DP_CHECK(m.double_block_ms > 0 && m.single_block_ms > 0 && m.embedders_ms >= 0 && m.output_ms >= 0,
             "calibrated times must be positive (blocks) and non-negative (embedders, output)");
    double_ms_per_flop = m.double_block_ms / (double_block_flops(c, t.height, t.width, t.text_tokens) * batch);
    single_ms_per_flop = m.single_block_ms / (single_block_flops(c, t.height, t.width, t.text_tokens) * batch);
    embedders_ms_per_flop = m.embedders_ms / (embedder_flops(c, t.height, t.width, t.text_tokens, 1) * batch);
    output_ms_per_flop = m.output_ms / (output_flops(c, t.height, t.width, 1) * batch);
  }
  std::vector<TimedUnit> units;
  auto add = [&](std::string name, std::vector<std::string> modules, double flops, double ms_per_flop) {
    TimedUnit u{std::move(name), std::move(modules), 0, flops, flops * ms_per_flop};
    for (const auto& m : u.modules) u.bytes += tree.size_of(m);
    units.push_back(std::move(u));
  };
  add("embedders", {"pos_embed", "time_text_embed", "context_embedder", "x_embedder"},
      embedder_flops(c, t.height, t.width, t.text_tokens, k) * batch, embedders_ms_per_flop);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string name = "transformer_blocks." + std::to_string(i);
    add(name, {name}, fd, double_ms_per_flop);
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string name = "single_transformer_blocks." + std::to_string(i);
    add(name, {name}, fs, single_ms_per_flop);
  }
  add("output", {"norm_out", "proj_out"}, output_flops(c, t.height, t.width, k) * batch, output_ms_per_flop);
  return units;
}

int64_t activation_workspace_bytes(const models::FluxConfig& c, const TimingModel& t, io::DType dtype, int num_stages) {
  const int64_t d = c.inner_dim();
  const int64_t tokens = rank_share(image_tokens(t.height, t.width), t.sequence_parallel) +
                         rank_share(t.text_tokens, t.sequence_parallel);
  const int64_t element = static_cast<int64_t>(io::dtype_size(dtype)) * t.batch;
  const int64_t state = tokens * d + d;                     // hidden states of both streams + temb
  const int64_t intermediates = tokens * (3 * d + 4 * d + d + 5 * d);  // qkv, MLP hidden, attention out, concat
  return element * (2 * static_cast<int64_t>(std::max(num_stages, 1)) * state + intermediates);
}

TimingReport time_placement(const std::vector<TimedUnit>& units, const ModuleTree& tree,
                            const std::map<std::string, Device>& tensor_devices, const std::vector<int>& world_gpus,
                            const TimingModel& timing) {
  TimingReport report;
  std::map<int, std::size_t> slot;
  for (int gpu : world_gpus) {
    slot[gpu] = report.stages.size();
    StageTime stage;
    stage.device = Device::gpu(gpu);
    report.stages.push_back(stage);
  }
  DP_CHECK(!report.stages.empty(), "stage times need at least one GPU in the world");
  const std::size_t execution_slot = 0;  // accelerate runs offloaded layers on the first GPU
  for (const auto& unit : units) {
    std::map<std::size_t, int64_t> resident;
    int64_t offloaded = 0;
    for (const auto& [tensor, device] : tensor_devices) {
      bool in_unit = false;
      for (const auto& m : unit.modules) in_unit = in_unit || under(tensor, m);
      if (!in_unit) continue;
      const int64_t bytes = tree.tensor_bytes(tensor);
      if (device.is_gpu() && slot.count(device.index)) resident[slot[device.index]] += bytes;
      else offloaded += bytes;
    }
    const double total = static_cast<double>(std::max<int64_t>(unit.bytes, 1));
    for (const auto& [s, bytes] : resident) {
      StageTime& stage = report.stages[s];
      stage.weight_bytes += bytes;
      stage.ms += unit.ms * static_cast<double>(bytes) / total;
      if (stage.first_unit.empty()) stage.first_unit = unit.name;
      stage.last_unit = unit.name;
    }
    if (offloaded > 0 || (resident.empty() && unit.bytes == 0)) {
      StageTime& stage = report.stages[execution_slot];
      stage.offloaded_bytes += offloaded;
      stage.ms += unit.ms * (unit.bytes == 0 ? 1.0 : static_cast<double>(offloaded) / total) +
                  static_cast<double>(offloaded) / (timing.offload_gb_per_s * 1e9) * 1e3;
      if (stage.first_unit.empty()) stage.first_unit = unit.name;
      stage.last_unit = unit.name;
    }
  }
  for (const auto& s : report.stages) {
    report.total_ms += s.ms;
    report.max_ms = std::max(report.max_ms, s.ms);
  }
  report.mean_ms = report.total_ms / static_cast<double>(report.stages.size());
  return report;
}

int64_t allocator_reserve_bytes(const models::FluxConfig& config, io::DType dtype) {
  constexpr int64_t kMiB = 1 << 20;
  const int64_t d = config.inner_dim();
  const int64_t blas_workspaces = 2 /* cuBLAS, cuBLASLt */ * 2 /* compute and copy streams */ * 32 * kMiB;
  const int64_t qkv_while_loading = 6 * d * d * static_cast<int64_t>(io::dtype_size(dtype));
  const int64_t coordinator_state = 64 * kMiB;
  // The first stage's modulation rows of a whole schedule (pipeline/flux_stage.h, kModulationTableBudgetBytes).
  const int64_t modulation_table = 128 * kMiB;
  return blas_workspaces + qkv_while_loading + coordinator_state + modulation_table;
}

int64_t allocator_weight_bytes(int64_t bytes) {
  constexpr int64_t kMiB = 1 << 20;
  const int64_t granule = bytes <= kMiB ? 512 : 2 * kMiB;
  return (bytes + granule - 1) / granule * granule;
}

PipelinePlacement plan_pipeline(const models::FluxConfig& config, const ModuleTree& tree, const MaxMemory& max_memory,
                                const TimingModel& timing, io::DType dtype, bool cuda_caps) {
  std::vector<std::pair<Device, int64_t>> gpus;
  for (const auto& entry : max_memory.entries())
    if (entry.first.is_gpu() && entry.second > 0) gpus.push_back(entry);
  DP_CHECK(!gpus.empty(), "the pipeline strategy needs at least one GPU with a memory budget (max_memory has none)");
  const auto units = flux_timed_units(config, tree, timing);
  const int n = static_cast<int>(units.size());
  const int k_max = static_cast<int>(gpus.size());
  PipelinePlacement out;
  out.workspace_bytes = activation_workspace_bytes(config, timing, dtype, std::min(k_max, n));
  out.allocator_reserve_bytes = cuda_caps ? allocator_reserve_bytes(config, dtype) : 0;
  // Each unit's weights as the allocator will reserve them (rounded per tensor).
  std::vector<int64_t> reserved_bytes(static_cast<size_t>(n), 0);
  for (const auto& tensor : tree.tensors_in_order()) {
    for (int u = 0; u < n; ++u) {
      bool in_unit = false;
      for (const auto& m : units[u].modules) in_unit = in_unit || under(tensor, m);
      if (!in_unit) continue;
      const int64_t bytes = tree.tensor_bytes(tensor);
      reserved_bytes[static_cast<size_t>(u)] += cuda_caps ? allocator_weight_bytes(bytes) : bytes;
      break;
    }
  }

  std::vector<double> time_prefix(n + 1, 0.0);
  std::vector<int64_t> bytes_prefix(n + 1, 0), reserved_prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    time_prefix[i + 1] = time_prefix[i] + units[i].ms;
    bytes_prefix[i + 1] = bytes_prefix[i] + units[i].bytes;
    reserved_prefix[i + 1] = reserved_prefix[i] + std::max(units[i].bytes, reserved_bytes[static_cast<size_t>(i)]);
  }
  // best[k][j]: the first j units on the first k GPUs (a GPU may stay empty), minimising (max stage time,
  // sum of squared stage times) so that ties prefer even splits.
  struct Cost {
    double max = std::numeric_limits<double>::infinity();
    double squares = std::numeric_limits<double>::infinity();
    bool operator<(const Cost& o) const { return max < o.max - 1e-12 || (max <= o.max + 1e-12 && squares < o.squares - 1e-12); }
  };
  std::vector<std::vector<Cost>> best(k_max + 1, std::vector<Cost>(n + 1));
  std::vector<std::vector<int>> cut(k_max + 1, std::vector<int>(n + 1, -1));
  best[0][0] = {0.0, 0.0};
  for (int k = 1; k <= k_max; ++k) {
    const int64_t budget = gpus[k - 1].second;
    for (int j = 0; j <= n; ++j) {
      for (int i = j; i >= 0; --i) {  // i == j: this GPU stays empty
        if (!std::isfinite(best[k - 1][i].max)) continue;
        const int64_t weights = reserved_prefix[j] - reserved_prefix[i];
        if (i < j && weights + out.workspace_bytes + out.allocator_reserve_bytes > budget) break;  // longer stages only grow
        const double stage = time_prefix[j] - time_prefix[i];
        const Cost candidate{std::max(best[k - 1][i].max, stage), best[k - 1][i].squares + stage * stage};
        if (candidate < best[k][j]) {
          best[k][j] = candidate;
          cut[k][j] = i;
        }
      }
    }
  }
  DP_CHECK(std::isfinite(best[k_max][n].max), "the pipeline strategy cannot fit the transformer (",
           bytes_prefix[n], " bytes of weights, plus ", out.workspace_bytes, " bytes of activation workspace and ",
           out.allocator_reserve_bytes, " bytes of allocator reserve per GPU at ",
           timing.height, "x", timing.width, ", batch ", timing.batch, ") in contiguous stages on ", k_max,
           " GPU(s) with max_memory ", max_memory.to_json().dump(), "; it does not offload: use --device-map auto");
  std::vector<int> owner(n, 0);
  for (int k = k_max, j = n; k > 0; --k) {
    const int i = cut[k][j];
    for (int u = i; u < j; ++u) owner[u] = k - 1;
    j = i;
  }
  DeviceMap map;
  for (int u = 0; u < n; ++u) {
    const Device device = gpus[owner[u]].first;
    for (const auto& m : units[u].modules) map.emplace_back(m, device);
    out.weights[device] += units[u].bytes;
  }
  out.device_map = clean_device_map(std::move(map));
  return out;
}

}  // namespace dp::placement
