#pragma once
// The denoising ring on paper: a discrete-event replay of the schedule src/pipeline/denoise_loop.cpp and
// src/runtime/ring.cpp run, for worlds larger than the machines we have. Rank 0 coordinates; the images are
// cut into microbatches; at most one step per ring stage is in flight; steps enter in microbatch order and
// a microbatch's next step enters as soon as rank 0 has applied the Euler update to its previous one. Each
// stage rank runs what reaches it in arrival order; each message crosses one point-to-point link. What it
// predicts (images/s, latency, idle stage time, bytes per link) is checked against the runtime's --report.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/flux/flux_config.h"
#include "placement/ring_stages.h"
#include "placement/stage_timing.h"

namespace dp::placement {

// One message over one link takes latency + bytes / bandwidth. GB are 1e9 bytes, one direction.
struct LinkModel {
  std::string name = "nvlink";
  double gb_per_s = 450.0;
  double latency_us = 2.0;
  double transfer_ms(int64_t bytes) const;
};

// "nvlink", "pcie" or "ib" (figures and their sources in the .cpp); throws naming the presets otherwise.
LinkModel link_preset(const std::string& name);
std::string link_presets_help();  // one line per preset, for --help

// What the K ranks of a stage group exchange among themselves in one denoising step: Ulysses' all-to-alls
// around each block's attention (mesh_simulation.h computes them). One rank's figures; every rank of the group
// sends as much at the same time, each over its own link, so the group takes as long as one rank.
struct GroupExchange {
  int64_t collectives = 0;      // all-to-alls per step (two per block)
  int64_t bytes_per_image = 0;  // what one rank sends in them per step, for one image
  LinkModel link;               // what one rank's share crosses (mesh_simulation.h: all_to_all_link)
  // Every collective costs the link's latency once (its messages to the K - 1 peers leave together), and the
  // bytes cross at the link's bandwidth.
  double ms(int64_t images) const;
};

struct RingSimulationInput {
  std::vector<int> stage_ranks;   // the ring's stage ranks in block order; only the first may be rank 0
  std::vector<double> stage_ms;   // compute per stage for one full microbatch and one step
  // Message sizes per image (a microbatch of b images moves b times as much).
  int64_t prompt_bytes_per_image = 0;      // rank 0 -> first stage once per microbatch, before the first step
  int64_t step_input_bytes_per_image = 0;  // rank 0 -> first stage each step: latents, timestep, guidance
  int64_t activation_bytes_per_image = 0;  // stage -> next stage each step: image, text, temb
  int64_t noise_bytes_per_image = 0;       // last stage -> rank 0 each step
  LinkModel link;
  // The runtime sends from a dedicated stream into pre-posted receives, so a rank computes while it sends.
  // false: a rank is blocked until its message is through (and that time counts as idle, not compute).
  bool transfers_overlap_compute = true;
  int64_t images = 1;  // prompts x images per prompt
  int64_t microbatch_size = 1;
  int steps = 28;
  double euler_ms = 0.1;  // rank 0's work per microbatch step: the Euler update and the loop's bookkeeping
  // Steps in flight at once; 0: one per stage, as RingExecutor::max_in_flight() allows. With transfers on
  // the ring's path a round trip outlasts stages x the slowest stage, and a deeper ring would hide them.
  int max_in_flight = 0;

  // --- A mesh of stage groups (placement/mesh.h): K > 1 ranks per stage, splitting the tokens ---
  // K = 1 is the ring above. With K > 1 every stage is a group of K ranks (rank = group x K + k); stage_ranks
  // name each group's first rank (a multiple of K), stage_ms and the message sizes are one rank's (its token
  // shard; mesh_simulation.h), and rank (g, k) sends its shard to rank (g + 1, k): K links side by side, each
  // carrying one shard, modelled as one. Rank 0 is shard 0 of group 0: it sends each message to the first
  // group's other K - 1 ranks (to all K when group 0 holds no stage), one shard after another over its own link,
  // and gathers the noise shards the same way; a rank computes only once its whole group has its inputs.
  int sequence_parallel = 1;
  // Per stage, the group's all-to-alls in one step, on the rank's critical path between its compute (the
  // attention needs them): a stage takes stage_ms + exchange.ms(). Empty: none (K = 1).
  std::vector<GroupExchange> stage_exchanges;
};

struct LinkTraffic {
  int from_rank = 0, to_rank = 0;
  int64_t bytes_per_step = 0;  // one denoising step of every microbatch
  int64_t bytes_total = 0;     // every step, plus the prompts on rank 0 -> first stage
  double busy_fraction = 0;    // share of the run the link is carrying a message
  // With K > 1: links side by side that this one stands for (K between stage groups, each with the bytes
  // above), and the ranks at the far end of rank 0's scatter (to_rank ...) or gather (from_rank ...).
  int parallel = 1;
  int peers = 1;
};

struct StageActivity {
  int rank = 0;
  double compute_ms = 0;
  double busy_fraction = 0;  // (compute_ms + all_to_all_ms) / total
  double all_to_all_ms = 0;  // K > 1: one rank's time in the group's all-to-alls, over the whole run
  int64_t all_to_all_bytes_per_step = 0;  // ... and what it sends in them in one step of every microbatch
};

struct RingSimulation {
  int sequence_parallel = 1;
  int64_t microbatches = 0;
  double total_ms = 0;  // from the first prompt sent to the last Euler update
  double images_per_s = 0;
  // Idle share of all stage ranks' time: 1 - sum(compute + all-to-all) / (stages x total).
  double bubble_fraction = 0;
  double coordinator_busy_fraction = 0;  // Euler updates (and rank 0's own stage, when it has one)
  std::vector<StageActivity> stages;
  std::vector<LinkTraffic> links;  // in ring order
};

// Throws dp::Error naming the input at fault (no stages, a negative time, rank 0 not first, ...).
RingSimulation simulate_ring(const RingSimulationInput& input);

// --- The FLUX ring a device map gives ---

// Message sizes per image for FLUX in the run dtype, as src/pipeline/flux_stage.h lays them out: prompts are
// T5 embeddings (N_txt, joint_attention_dim) and the pooled CLIP vector; step inputs the packed latents
// (N_img, in_channels), the timestep and, with guidance embeds, a float32 guidance; between stages image
// (N_img, D), text (N_txt, D) and temb (D); the noise (N_img, out_channels).
// sequence_parallel = K > 1: one rank's shard, the longest (mesh.h: token_shard) of the image and text tokens;
// the pooled vector, the timestep, the guidance and temb go whole to every rank.
struct RingMessageBytes {
  int64_t prompts = 0, step_inputs = 0, activations = 0, noise = 0;
};
RingMessageBytes flux_ring_message_bytes(const models::FluxConfig& config, int64_t height, int64_t width,
                                         int64_t text_tokens, io::DType dtype, int sequence_parallel = 1);

// Compute time of each ring stage: its blocks, plus the embedders on the first and the output layers on the
// last (where FluxStage runs them, whatever the map says of those small modules). `units` as
// flux_timed_units returns them: embedders, every block in order, output.
std::vector<double> flux_ring_stage_ms(const std::vector<TimedUnit>& units, const std::vector<RankStage>& stages);

// What a transformer device map asks of the launcher: GPU d is rank d, so it needs 1 + the highest GPU index
// it names (at least rank 0, the coordinator), and the ring the runtime would build from it.
struct MapRanks {
  int ranks = 1;
  std::vector<int> gpus_with_blocks;
  std::vector<RankStage> stages;  // empty when the runtime cannot run the map
  std::string unsupported;        // why it cannot (no block on a GPU, a rank visited twice, ...); "" when it can
};
MapRanks map_ranks(const nlohmann::ordered_json& hf_device_map, const models::FluxConfig& config);

nlohmann::ordered_json to_json(const LinkModel& link);
nlohmann::ordered_json to_json(const RingSimulation& simulation);
nlohmann::ordered_json to_json(const MapRanks& ranks);

}  // namespace dp::placement
