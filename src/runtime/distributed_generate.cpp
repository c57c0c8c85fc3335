#include "runtime/distributed_generate.h"

#include <c10/core/InferenceMode.h>

#include <functional>
#include <iomanip>
#include <optional>

#include "core/log.h"
#include "io/parallel_load.h"
#include "models/flux/fp8_gemm.h"
#include "pipeline/device_stats.h"
#include "pipeline/encoder_warm_up.h"
#include "runtime/agree_phase.h"
#include "runtime/decode_phase.h"
#include "runtime/encode_phase.h"
#include "runtime/load_phase.h"
#include "runtime/rank_report.h"
#include "runtime/trace_file.h"
#include "runtime/ring_phase.h"
#include "runtime/run_context.h"
#include "runtime/transports.h"
#include "runtime/world.h"

namespace dp::runtime {
namespace {

// A rank other than 0: load its blocks while rank 0 finishes encoding, run them for the ring, decode if it is
// the VAE's rank, report, and learn from the coordinator whether the run stopped.
GenerateOutcome run_worker(RunContext& run) {
  LoadedStage loaded = take_loaded_stage(run);
  run.connect_transport();  // unless the encode phase did
  std::optional<WorkerDecode> decode;
  if (run.decode && run.world.rank() == run.components.vae.rank) {
    decode.emplace(run);
    decode->prepare(loaded.bytes);
  }
  RankFigures figures;
  figures.load_seconds = loaded.seconds;
  figures.load_bytes = loaded.bytes;
  figures.times = worker_ring_phase(run, loaded.stage.get(), decode ? decode->handler() : std::function<void(Message&)>());
  log_offload(run, loaded.stage.get());
  figures.offload = loaded.stage ? loaded.stage->offload_stats() : models::OffloadStats{};
  loaded.stage.reset();  // the blocks are freed before a VAE that did not fit next to them loads
  if (decode) decode->finish();
  const Transport& transport = *run.transport;
  DP_INFO("rank ", run.world.rank(), ": ", figures.times.steps, " microbatch steps, ", std::fixed, std::setprecision(2),
          figures.times.compute_seconds, " s computing, ", figures.times.wait_seconds, " s waiting; ",
          transport.bytes_sent() / 1e6, " MB sent, ", transport.bytes_received() / 1e6, " MB received",
          run.exchange ? str("; ", figures.times.exchanges, " all-to-alls, ", transport.exchange_bytes_sent() / 1e6,
                             " MB out, ", figures.times.exchange_seconds, " s") : std::string());
  write_rank_report(run, figures);
  GenerateOutcome outcome;
  outcome.stopped = run.world.share_from_coordinator(0, run.options.transport_timeout_seconds) != 0;
  return outcome;
}

// Rank 0: the prompts' embeddings and the initial noise, the ring with its checkpoints, then the images or the
// latents.
GenerateOutcome run_coordinator(RunContext& run, EncodedPrompts encoded) {
  const CoordinatorStart start = coordinator_start(run, std::move(encoded));
  // The text encoders' cached segments would otherwise be split by the blocks' weights and count against the cap.
  pipeline::release_cached_memory(run.device);
  CoordinatorImages images(run);
  CoordinatorRing ring = coordinator_ring_phase(run, start, images);
  // The blocks' freed segments go back to the driver only under a cap, which counts them. Without one the last
  // decode, which now follows the ring, need not wait for the driver's frees: the allocator returns cached
  // segments by itself when a new one does not fit.
  if (!run.options.max_memory.empty()) pipeline::release_cached_memory(run.device);
  const auto& on_latents = run.outputs.on_latents;
  if (ring.outcome.stopped || !run.decode) {
    // Stopped: the checkpoint holds the state, and the images of microbatches finished before it are written
    // (the last one decodes only now, once the blocks are freed).
    if (ring.outcome.stopped && images.every_microbatch_handed_over()) images.finish();
    write_rank_report(run, ring.figures);
    if (!ring.outcome.stopped && on_latents) on_latents(ring.final_latents);
    return ring.outcome;
  }
  if (on_latents) on_latents(ring.final_latents);
  images.finish();
  // After the decode, so that the peak memory it reports covers a decode left for the end.
  write_rank_report(run, ring.figures);
  images.check_all_written();
  return ring.outcome;
}

}  // namespace

GenerateOutcome distributed_generate(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                                     const pipeline::LatentGrid& grid, const RuntimeOptions& options,
                                     const Outputs& outputs) {
  c10::InferenceMode guard;
  RunContext run(flux, request, grid, options, outputs, World::get());
  agree_phase(run);
  start_trace(run);
  run.device = rank_device(request.device, run.world);
  cap_device_memory(run);
  if (options.fp8_gemms) models::flux::set_fp8_gemms_enabled(true);  // or DIFFPIPE_FP8_GEMMS=1
  if (models::flux::fp8_gemms_enabled()) {
    models::flux::check_fp8_gemms_supported(request.dtype, run.device);
    DP_INFO("rank ", run.world.rank(), ": the transformer blocks' projections run as FP8 GEMMs (--fp8-gemms): e4m3 "
            "weights with a scale per channel, inputs with a scale per token");
  }
  // Read-ahead holds a component in its file's dtype until the model takes each tensor; under a cap, tensors
  // stored wider than the run dtype are read one by one instead.
  io::LoadPolicy load_policy = io::load_policy();
  load_policy.bounded_memory = !options.max_memory.empty();
  // --fp8-gemms under a cap: one block at a time is read at the run dtype and converted, the headroom the plan
  // keeps for it (placement/plan.h).
  if (load_policy.bounded_memory) load_policy.converting_part_bytes = 1;
  io::set_load_policy(load_policy);
  pipeline::set_encoder_warm_up(options.warm_up && options.max_memory.empty());
  if (run.world.uses_mpi()) run.transport = make_transport(run.transport_name, run.layout(), run.world, run.device, options);
  if (run.layout().sequence_parallel() > 1) run.exchange = std::make_unique<GroupExchange>(*run.transport);
  start_load_overlap(run);
  EncodedPrompts encoded = encode_phase(run);
  encoders_released(run);
  const GenerateOutcome outcome = run.world.is_coordinator() ? run_coordinator(run, std::move(encoded)) : run_worker(run);
  write_trace(run);
  return outcome;
}

}  // namespace dp::runtime
