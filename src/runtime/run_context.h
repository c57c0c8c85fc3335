#pragma once
// What the phases of a run (agree, encode, load, ring, decode) share on one rank: the request as every rank
// received it, what the ranks agreed on, and this rank's device and transport. The agree phase fills it; the
// later phases only read it (the transport excepted, which they use).
#include <ATen/ATen.h>

#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/load_budget.h"
#include "pipeline/flux_pipeline.h"
#include "placement/ring_stages.h"
#include "runtime/components.h"
#include "runtime/distributed_generate.h"
#include "runtime/group_exchange.h"
#include "runtime/mesh_layout.h"
#include "runtime/ring.h"
#include "runtime/transport.h"

namespace dp::pipeline {
class FluxStage;  // pipeline/flux_stage.h
}  // namespace dp::pipeline

namespace dp::runtime {

class World;

// This rank's piece of the transformer once loaded (load_phase.h).
struct LoadedStage {
  std::shared_ptr<pipeline::FluxStage> stage;  // null on a rank without blocks
  double seconds = 0;
  uint64_t bytes = 0;
};

// The transformer split every rank computes from the same headers.
struct TransformerPlan {
  nlohmann::ordered_json hf_device_map;
  std::vector<placement::RankStage> stages;
  std::string digest;
  std::string times_from;  // which block times the split was planned from (calibrated FILE, FLOP-scaled), and why
  std::string block_weights;  // --fp8-gemms: the sizes the blocks were planned at, and why; empty without the flag
};

struct RunContext {
  RunContext(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request, const pipeline::LatentGrid& grid,
             const RuntimeOptions& options, const Outputs& outputs, World& world)
      : flux(flux), request(request), grid(grid), options(options), outputs(outputs), world(world) {}
  // A run that ends before its encoders are released (a failure while encoding) lets an overlapped load finish
  // rather than wait out its budget's timeout.
  ~RunContext() {
    if (encoder_weights_gate) encoder_weights_gate->lift();
    if (load_budget) load_budget->lift();
  }
  RunContext(const RunContext&) = delete;
  RunContext& operator=(const RunContext&) = delete;

  pipeline::FluxPipeline& flux;
  const pipeline::GenerateRequest& request;
  const pipeline::LatentGrid& grid;
  const RuntimeOptions& options;
  const Outputs& outputs;
  World& world;

  // Agreed by every rank (agree phase).
  std::string transport_name;
  bool decode = false;  // PNG output: the VAE runs
  std::string transformer_dir;
  std::string fingerprint;  // model_fingerprint(transformer_dir)
  ComponentPlan components;
  TransformerPlan plan;
  std::optional<MeshLayout> mesh;
  // The run's identity in reports and traces: rank 0's run id (the checkpoints' one), and the request every
  // rank agreed on, so that `diffpipe report` can refuse files of different runs put together.
  std::string run_id;
  std::string request_summary;

  // This rank's.
  at::Device device = at::kCPU;
  std::unique_ptr<Transport> transport;  // null in a world of one
  // This rank's sequence group's all-to-all over the transport; null when the groups are single ranks.
  std::unique_ptr<GroupExchange> exchange;
  // This rank's blocks, loading on a thread while the encoders run (load_phase.h); invalid when loaded in turn.
  // The budget bounds what that load holds until the encoders are released; declared first, so that it outlives
  // the loader, which the future's destructor waits for.
  std::shared_ptr<io::LoadBudget> load_budget;
  // Lifted once the encoders' weights are on the device: the overlapped load starts then, not beside theirs.
  std::shared_ptr<io::LoadBudget> encoder_weights_gate;
  std::future<LoadedStage> early_load;
  bool load_overlapped = false;
  std::string load_overlap_reason;  // why it was chosen or not (load_phase.h)

  const MeshLayout& layout() const { return *mesh; }
  const CheckpointOptions& checkpoints() const { return options.checkpoints; }
  int64_t batch() const { return request.batch(); }
  int64_t microbatches() const { return (batch() + options.microbatch_size - 1) / options.microbatch_size; }
  // Rows of microbatch `id`: the loop cuts the batch into microbatch_size rows, the last one smaller.
  int64_t microbatch_rows(int64_t id) const { return std::min(options.microbatch_size, batch() - id * options.microbatch_size); }
  // The encoders run on the ranks the component map names; a resume runs none, and the embeddings cache lives
  // with the coordinator: then rank 0 takes the whole encode phase (every rank reads the same flags).
  bool encoders_on_their_ranks() const { return !checkpoints().resume && checkpoints().embeddings_cache.empty(); }
  // Completes the transport's set-up (Transport::connect), at one of two points every rank reaches in the same
  // order: in the encode phase when encoder ranks other than 0 send their embeddings (after this rank's own
  // encoding), else once this rank's blocks are loaded, before the ring. Until then the communicators are
  // created in the background, beside the encoders and the loads. Calls after the first do nothing.
  void connect_transport() {
    if (transport) transport->connect();
  }
};

}  // namespace dp::runtime
