#include "placement/mesh_simulation.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dp::placement {

SequenceParallelLimits flux_sequence_parallel_limits(const models::FluxConfig& config, int64_t height, int64_t width,
                                                     int64_t text_tokens) {
  DP_CHECK(height > 0 && width > 0 && height % 16 == 0 && width % 16 == 0, "resolution ", height, "x", width,
           " must be positive multiples of 16");
  return {config.num_attention_heads, text_tokens, (height / 16) * (width / 16)};
}

UlyssesBytes ulysses_bytes_per_block(const models::FluxConfig& config, int64_t height, int64_t width,
                                     int64_t text_tokens, io::DType dtype, int sequence_parallel) {
  const auto limits = flux_sequence_parallel_limits(config, height, width, text_tokens);
  const int k = sequence_parallel;
  DP_CHECK(k >= 1, "--sequence-parallel must be at least 1, got ", k);
  DP_CHECK(config.num_attention_heads % k == 0, "--sequence-parallel ", k, " does not divide the ",
           config.num_attention_heads, " attention heads");
  const int64_t shard = token_shard(limits.image_tokens, k, 0).count + token_shard(limits.text_tokens, k, 0).count;
  // Of its shard's D features per token, a rank sends the H/K heads of each of its K - 1 peers.
  const int64_t sent_features = config.inner_dim() / k * (k - 1);
  const int64_t element = static_cast<int64_t>(io::dtype_size(dtype));
  return {3 * shard * sent_features * element, shard * sent_features * element};
}

LinkModel all_to_all_link(const LinkModel& link, const MeshShape& mesh, int stage, int gpus_per_node) {
  DP_CHECK(gpus_per_node >= 1, "--gpus-per-node must be at least 1, got ", gpus_per_node);
  const int k = mesh.sequence_parallel;
  const auto ranks = mesh.group(stage);
  const auto node = [&](int rank) { return rank / gpus_per_node; };
  if (node(ranks.front()) == node(ranks.back()) || link.name == "ib") return link;
  const LinkModel ib = link_preset("ib");
  // Per rank: seconds per byte-per-peer over each path; the slowest rank of the group sets its pace.
  double slowest = 0;
  for (int r : ranks) {
    int same_node = 0;
    for (int peer : ranks) same_node += (peer != r && node(peer) == node(r)) ? 1 : 0;
    const int other_nodes = k - 1 - same_node;
    slowest = std::max(slowest, std::max(same_node / link.gb_per_s, other_nodes / ib.gb_per_s));
  }
  return {link.name + "+ib", static_cast<double>(k - 1) / slowest, std::max(link.latency_us, ib.latency_us)};
}

std::vector<GroupExchange> flux_stage_exchanges(const UlyssesBytes& per_block, const std::vector<RankStage>& stages,
                                                const MeshShape& mesh, const LinkModel& link, int gpus_per_node) {
  std::vector<GroupExchange> out;
  for (const auto& s : stages) {
    const int64_t blocks = s.last_block - s.first_block;
    out.push_back({2 * blocks, blocks * per_block.per_block(), all_to_all_link(link, mesh, s.rank, gpus_per_node)});
  }
  return out;
}

MeshSweep sweep_meshes(const std::vector<MeshCandidate>& candidates, const RingSimulationInput& one_gpu,
                       int64_t latency_images, int64_t throughput_images) {
  DP_CHECK(latency_images >= 1 && throughput_images >= 1, "the mesh sweep needs at least one image, got ",
           latency_images, " and ", throughput_images);
  MeshSweep sweep;
  sweep.latency_images = latency_images;
  sweep.throughput_images = throughput_images;
  RingSimulationInput ceiling = one_gpu;
  ceiling.images = throughput_images;
  sweep.one_gpu_images_per_s = simulate_ring(ceiling).images_per_s;
  for (const auto& c : candidates) {
    MeshSweepRow row;
    row.mesh = c.mesh;
    row.excluded = c.excluded;
    row.weights_bytes_per_gpu = c.weights_bytes_per_gpu;
    if (c.excluded.empty()) {
      const auto& in = c.ring;
      for (size_t i = 0; i < in.stage_ms.size(); ++i) {
        const double exchange = in.stage_exchanges.empty() ? 0.0 : in.stage_exchanges[i].ms(in.microbatch_size);
        if (in.stage_ms[i] + exchange > row.rank_step_ms) {
          row.rank_step_ms = in.stage_ms[i] + exchange;
          row.all_to_all_ms_per_step = exchange;
          row.all_to_all_bytes_per_step =
              in.stage_exchanges.empty() ? 0 : in.stage_exchanges[i].bytes_per_image * in.microbatch_size;
        }
      }
      RingSimulationInput run = in;
      run.images = latency_images;
      row.latency_s = simulate_ring(run).total_ms * 1e-3;
      run.images = throughput_images;
      row.throughput = simulate_ring(run);
      row.efficiency = sweep.one_gpu_images_per_s > 0
                           ? row.throughput.images_per_s / (c.mesh.world_size() * sweep.one_gpu_images_per_s)
                           : 0.0;
      const int index = static_cast<int>(sweep.rows.size());
      // Strictly better only, so that a tie keeps the earlier mesh.
      if (sweep.best_latency < 0 || row.latency_s < sweep.rows[sweep.best_latency].latency_s * (1 - 1e-12))
        sweep.best_latency = index;
      if (sweep.best_throughput < 0 ||
          row.throughput.images_per_s > sweep.rows[sweep.best_throughput].throughput.images_per_s * (1 + 1e-12))
        sweep.best_throughput = index;
    }
    sweep.rows.push_back(std::move(row));
  }
  return sweep;
}

nlohmann::ordered_json to_json(const MeshSweep& sweep) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < sweep.rows.size(); ++i) {
    const auto& r = sweep.rows[i];
    nlohmann::ordered_json row = {{"stages", r.mesh.stages}, {"sequence_parallel", r.mesh.sequence_parallel},
                                  {"world_size", r.mesh.world_size()}, {"weights_bytes_per_gpu", r.weights_bytes_per_gpu}};
    if (!r.excluded.empty()) {
      row["excluded"] = r.excluded;
      rows.push_back(row);
      continue;
    }
    row["rank_step_ms"] = r.rank_step_ms;
    row["all_to_all_ms_per_step"] = r.all_to_all_ms_per_step;
    row["all_to_all_bytes_per_step"] = r.all_to_all_bytes_per_step;
    row["latency_s"] = r.latency_s;
    row["images_per_s"] = r.throughput.images_per_s;
    row["efficiency"] = r.efficiency;
    row["bubble_fraction"] = r.throughput.bubble_fraction;
    row["best_latency"] = static_cast<int>(i) == sweep.best_latency;
    row["best_throughput"] = static_cast<int>(i) == sweep.best_throughput;
    row["throughput_run"] = to_json(r.throughput);
    rows.push_back(row);
  }
  const auto mesh_of = [&](int index) -> nlohmann::ordered_json {
    if (index < 0) return nullptr;
    const auto& m = sweep.rows[static_cast<size_t>(index)].mesh;
    return {{"stages", m.stages}, {"sequence_parallel", m.sequence_parallel}};
  };
  return {{"latency_images", sweep.latency_images}, {"throughput_images", sweep.throughput_images},
          {"one_gpu_images_per_s", sweep.one_gpu_images_per_s}, {"best_latency", mesh_of(sweep.best_latency)},
          {"best_throughput", mesh_of(sweep.best_throughput)}, {"rows", rows}};
}

}  // namespace dp::placement
