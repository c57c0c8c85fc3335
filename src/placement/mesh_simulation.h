#pragma once
// The ring simulator on a mesh of S stage groups x K sequence-parallel ranks (placement/mesh.h): what one rank
// of a group exchanges with its peers around attention (Ulysses), the link that exchange crosses, and the sweep
// over every mesh of a world that picks the best one for one image and for many.
//
// Ulysses, per block (double and single alike: both attend over the joint text + image sequence of L tokens):
// a rank holds L / K tokens with all H heads of q, k and v; one all-to-all gives it all L tokens of H / K heads,
// attention runs, and a second all-to-all returns the output to "my tokens, all heads". In each a rank keeps the
// 1/K addressed to itself and sends (K - 1)/K of its shard, 1/K to each peer:
//   in:  3 x B x (L / K) x D x (K - 1) / K elements (q, k, v),
//   out: 1 x B x (L / K) x D x (K - 1) / K elements.
// With uneven shards the longest one (mesh.h: token_shard) sets the group's pace, and it is what is counted.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/flux/flux_config.h"
#include "placement/mesh.h"
#include "placement/ring_simulator.h"
#include "placement/ring_stages.h"

namespace dp::placement {

// What K must satisfy for FLUX at this request: the attention heads, the T5 tokens and the packed latent tokens.
SequenceParallelLimits flux_sequence_parallel_limits(const models::FluxConfig& config, int64_t height, int64_t width,
                                                     int64_t text_tokens);

// One rank's bytes in the two all-to-alls of one block, for one image (the header's formulas). Zero for K = 1.
struct UlyssesBytes {
  int64_t qkv = 0;  // sent before attention
  int64_t out = 0;  // sent after it
  int64_t per_block() const { return qkv + out; }
};
UlyssesBytes ulysses_bytes_per_block(const models::FluxConfig& config, int64_t height, int64_t width,
                                     int64_t text_tokens, io::DType dtype, int sequence_parallel);

// The link one rank's share of stage group `stage`'s all-to-all crosses. Ranks are numbered node by node,
// `gpus_per_node` to a node, and a group is K consecutive ranks (mesh.h), so it spans nodes only when K exceeds
// a node or straddles a node boundary. Inside one node: `link` as given (NVLink, PCIe, ...). Across nodes
// (unless `link` is already "ib"): the peers on the rank's node are reached over `link` and the others over
// InfiniBand (the "ib" preset) at the same time, two separate paths, so a rank takes
//   max(in-node peers / link bandwidth, other-node peers / ib bandwidth) x bytes per peer,
// which is returned as one link of that effective bandwidth, named "LINK+ib", with the larger latency. The
// slowest rank of the group counts. With link "ib" every message leaves through the GPU's one port anyway.
LinkModel all_to_all_link(const LinkModel& link, const MeshShape& mesh, int stage, int gpus_per_node);

// The all-to-alls of each ring stage for one rank and one step: two per block of the stage. `stages` are
// map_ranks' stages, whose rank is the stage group's index (GPU d of a map = stage group d).
std::vector<GroupExchange> flux_stage_exchanges(const UlyssesBytes& per_block, const std::vector<RankStage>& stages,
                                                const MeshShape& mesh, const LinkModel& link, int gpus_per_node);

// --- The sweep: every mesh (S, K) of a world, one image's latency and many images' throughput side by side ---

struct MeshCandidate {
  MeshShape mesh;
  std::string excluded;               // why this mesh cannot run ("" when it can): K invalid, or out of memory
  RingSimulationInput ring;           // its ring (images are set by the sweep)
  int64_t weights_bytes_per_gpu = 0;  // the largest stage's weights, held by every rank of its group
};

struct MeshSweepRow {
  MeshShape mesh;
  std::string excluded;
  int64_t weights_bytes_per_gpu = 0;
  // One rank of the slowest stage, one full microbatch step: compute + all-to-all, and the all-to-all part alone.
  double rank_step_ms = 0;
  double all_to_all_ms_per_step = 0;
  int64_t all_to_all_bytes_per_step = 0;  // what that rank sends in its all-to-alls per step
  double latency_s = 0;                   // from the first prompt sent to the last update, for latency_images
  RingSimulation throughput;              // throughput_images
  double efficiency = 0;                  // throughput images/s over world x one GPU's images/s
};

struct MeshSweep {
  int64_t latency_images = 1;
  int64_t throughput_images = 1;
  double one_gpu_images_per_s = 0;  // at throughput_images
  std::vector<MeshSweepRow> rows;   // in the candidates' order
  int best_latency = -1;            // index into rows; -1 when no mesh can run
  int best_throughput = -1;
};

// Simulates every candidate that can run, at latency_images (one prompt) and throughput_images, and marks the
// lowest latency and the most images/s (ties: the first in the candidates' order). `one_gpu`: the whole
// transformer on one GPU, the ceiling efficiency is measured against.
MeshSweep sweep_meshes(const std::vector<MeshCandidate>& candidates, const RingSimulationInput& one_gpu,
                       int64_t latency_images, int64_t throughput_images);

nlohmann::ordered_json to_json(const MeshSweep& sweep);

}  // namespace dp::placement
