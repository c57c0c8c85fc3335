#include "runtime/load_phase.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <iomanip>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "core/human_units.h"
#include "io/load_budget.h"
#include "io/weight_index.h"
#include "pipeline/device_stats.h"
#include "pipeline/phase_guard.h"
#include "placement/plan.h"
#include "runtime/world.h"

namespace dp::runtime {
namespace {

// The offloaded blocks of a stage as the model takes them: "cpu" blocks wait in pinned host memory, "disk"
// blocks in the mmapped safetensors file (accelerate's two offload tiers).
std::map<int64_t, models::OffloadedWeights> offloaded_weights(const placement::RankStage& stage) {
  std::map<int64_t, models::OffloadedWeights> out;
  for (const auto& o : stage.offloaded)
    out[o.block] = o.tier == placement::OffloadTier::cpu ? models::OffloadedWeights::pinned_host
                                                         : models::OffloadedWeights::mapped_file;
  return out;
}

// This rank's tokens when its group splits the sequence (the default, whole sequence, otherwise).
models::flux::SequenceShard sequence_shard(const RunContext& run) {
  const MeshLayout& layout = run.layout();
  if (layout.sequence_parallel() == 1) return {};
  models::flux::SequenceShard shard;
  shard.index = layout.shard_of(run.world.rank());
  for (int k = 0; k < layout.sequence_parallel(); ++k) {
    shard.text_counts.push_back(layout.text_shard(k).count);
    shard.image_counts.push_back(layout.image_shard(k).count);
  }
  shard.exchange = run.exchange.get();
  return shard;
}

// Warms `stages` up (FluxStage::warm_up) at the run's microbatch rows, on this thread, and logs it.
void warm_up(const RunContext& run, const std::vector<const pipeline::FluxStage*>& stages, const std::string& note,
             trace::Track track = trace::Track::host) {
  const int64_t rows = std::min(run.options.microbatch_size, run.batch());
  double seconds = 0;
  for (const pipeline::FluxStage* stage : stages) {
    seconds += pipeline::run_phase(
        run.world.rank(), "warming up the blocks", [&] { return stage->warm_up(rows, run.request.steps); }, track);
  }
  DP_INFO("rank ", run.world.rank(), ": warmed up one block of each kind at ", rows, " row(s) in ", std::fixed,
          std::setprecision(3), seconds, " s", note);
}

// The overlapped load's work runs on a stream of its own: on the encoders' stream its dtype conversions, q|k|v
// concatenations and warm-up would queue between their kernels (measured on an H200: encode 2.9 s instead of
// 1.2 s). The loop's thread uses the blocks on its own stream, so the load's work is finished before they go.
template <typename Work>
auto on_loader_stream(const at::Device& device, Work&& work) {
#ifdef DIFFPIPE_HAVE_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAStreamGuard stream(c10::cuda::getStreamFromPool(false, device.index()));
    auto result = work();
    stream.current_stream().synchronize();
    return result;
  }
#endif
  (void)device;
  return work();
}

void log_loaded(const RunContext& run, const placement::RankStage& mine, const LoadedStage& loaded) {
  DP_INFO("rank ", run.world.rank(), ": loaded blocks [", mine.first_block, ", ", mine.last_block, "): ",
          human_size(static_cast<double>(loaded.bytes)), " in ", human_seconds(loaded.seconds), " (",
          human_size(loaded.seconds > 0 ? loaded.bytes / loaded.seconds : 0.0), "/s)");
}

// This rank's blocks read onto its device, its offloaded blocks and LoRA adapters with them (no warm-up). `track`:
// where --trace draws the load (the background track when the warm-up runs on the host's beside it).
std::shared_ptr<pipeline::FluxStage> read_blocks(const RunContext& run, const placement::RankStage& mine,
                                                 trace::Track track = trace::Track::host) {
  const std::string phase = str("loading blocks [", mine.first_block, ", ", mine.last_block, ")");
  return pipeline::run_phase(
      run.world.rank(), phase,
      [&] {
        return std::make_shared<pipeline::FluxStage>(run.transformer_dir, mine.first_block, mine.last_block,
                                                     run.request.dtype, run.device, run.grid,
                                                     run.request.max_sequence_length, offloaded_weights(mine),
                                                     sequence_shard(run), run.request.lora);
      },
      track);
}

// Whether the warm-up runs on the loop's thread while the blocks load (load_warming_up_beside): with room to spare
// (no --max-memory; no offloaded block) and no LoRA (an unfused adapter's warm-up needs the run's own stage).
// Under the seed's 16 GB caps it was tried where the cap held the copies: step 1 came no sooner on two ranks
// sharing an H100 (2.26 and 2.11 s against 2.29 and 2.13 s), each rank's peak rose by up to 1.45 GB and rank 1
// reserved its whole cap (bench/RESULTS.md, session 21). On by default on CUDA: on an H100 it took the transformer's
// load and warm-up from 1.03 s to 0.73 s and one image from 5.98 s to 5.74 s, peak 24.3 GB to 25.3 GB; under
// --fp8-gemms it measured even, the conversion competing for the GPU (bench/RESULTS.md, session 17).
// DIFFPIPE_WARM_UP_BESIDE_LOAD=0 turns it off; =1 turns it on on the CPU too, which only gives the tests a way
// through the same code (the CPU has no kernels to load and two threads there compete for its cores).
bool warms_up_beside_the_load(const RunContext& run, const placement::RankStage& mine) {
  const char* setting = std::getenv("DIFFPIPE_WARM_UP_BESIDE_LOAD");
  const bool wanted = setting == nullptr ? run.device.is_cuda() : std::string(setting) == "1";
  return wanted && run.options.warm_up && run.options.max_memory.empty() && mine.offloaded.empty() &&
         !run.request.lora;
}

// Zeros of the shapes of this rank's blocks [first, last) (with the embedders or the head when the range starts or
// ends the model), made from the headers alone: what the warm-up needs is the run's shapes, not the weights.
std::shared_ptr<pipeline::FluxStage> zero_blocks(const RunContext& run, int64_t first, int64_t last) {
  return std::make_shared<pipeline::FluxStage>(
      run.transformer_dir, first, last, run.request.dtype, run.device, run.grid, run.request.max_sequence_length,
      std::map<int64_t, models::OffloadedWeights>{}, sequence_shard(run), nullptr, models::WeightSource::zeros);
}

// The staged load with the warm-up beside it: a helper thread reads the rank's blocks while this thread, the
// loop's (cuDNN builds its attention graphs per thread), warms up zero-weight copies of its first and last
// blocks, with the embedders and the head when the rank holds them, so that every GEMM shape of a step is among
// them. The copies (about 1 GB for the whole FLUX.1-dev) are freed before the loop. Before, the two blocks were
// read from the files first, which cost what the overlap saved (0.06 s on an H100, bench/RESULTS.md, 2026-12-05).
LoadedStage load_warming_up_beside(const RunContext& run, const placement::RankStage& mine) {
  LoadedStage loaded;
  const auto started = std::chrono::steady_clock::now();
  auto reading = std::async(std::launch::async, [&] {
    c10::InferenceMode inference;  // per thread, as is the device
    c10::OptionalDeviceGuard device_guard;
    if (run.device.is_cuda()) device_guard.reset_device(run.device);
    return on_loader_stream(run.device, [&] { return read_blocks(run, mine, trace::Track::background_load); });
  });
  try {
    std::vector<std::shared_ptr<pipeline::FluxStage>> samples{
        zero_blocks(run, mine.first_block, mine.first_block + 1)};
    if (mine.last_block - 1 > mine.first_block)
      samples.push_back(zero_blocks(run, mine.last_block - 1, mine.last_block));
    std::vector<const pipeline::FluxStage*> sampled;
    for (const auto& sample : samples) sampled.push_back(sample.get());
    warm_up(run, sampled, " on the loop's thread while the blocks loaded (zero-weight copies of the first and last)");
  } catch (...) {
    reading.wait();  // the helper reads through references to this frame
    throw;
  }
  loaded.stage = reading.get();
  loaded.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  loaded.bytes = loaded.stage->weight_bytes();
  log_loaded(run, mine, loaded);
  return loaded;
}

}  // namespace

at::Device rank_device(const at::Device& requested, const World& world) {
  if (!requested.is_cuda()) return requested;
#ifdef DIFFPIPE_HAVE_CUDA
  const int visible = static_cast<int>(at::cuda::device_count());
  DP_CHECK(visible > 0, "--device cuda, but rank ", world.rank(), " on ", world.host(), " sees no CUDA device");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank() % visible));
#else
  DP_FAIL("--device cuda: this build has no CUDA support");
#endif
}

// Two ranks capped at 16 GB on one H200 behave like the seed's two 16 GB cards. An allocation past the cap fails
// with LibTorch's out-of-memory error, which names the cap; run_guarded adds the rank.
void cap_device_memory(const RunContext& run) {
  const auto& options = run.options;
  const at::Device& device = run.device;
  if (options.max_memory.empty() || !device.is_cuda()) return;
  const auto caps = placement::read_max_memory_argument(options.max_memory);
  // GPU d of --max-memory is stage group d (rank d without --sequence-parallel).
  const auto gpu = placement::Device::gpu(run.layout().group_of(run.world.rank()));
  if (!caps.has(gpu)) return;
#ifdef DIFFPIPE_HAVE_CUDA
  // The allocator sizes its per-device tables on first use; the cap must come after that.
  at::globalContext().lazyInitDevice(at::kCUDA);
  const auto total = static_cast<double>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
  const double fraction = std::min(1.0, static_cast<double>(caps.at(gpu)) / total);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
  DP_INFO("rank ", run.world.rank(), ": CUDA allocator capped at ", caps.at(gpu) / 1e9, " GB (", std::fixed,
          std::setprecision(3), fraction, " of ", total / 1e9, " GB)");
#else
  DP_FAIL("this build has no CUDA support");
#endif
}

LoadedStage load_phase(const RunContext& run, trace::Track track) {
  LoadedStage loaded;
  const placement::RankStage* mine = run.layout().stage_of(run.world.rank());
  if (mine == nullptr) return loaded;
  const auto started = std::chrono::steady_clock::now();
  loaded.stage = read_blocks(run, *mine, track);
  loaded.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  loaded.bytes = loaded.stage->weight_bytes();
  if (run.options.warm_up) warm_up(run, {loaded.stage.get()}, "", track);
  log_loaded(run, *mine, loaded);
  return loaded;
}

namespace {

// A component's device memory while it loads and runs: its tensors at the run dtype or, when the files store
// them wider, as read (the read-ahead holds them in the file's dtype until the model takes them).
uint64_t component_bytes(const std::string& dir, at::ScalarType dtype) {
  const auto index = io::WeightIndex::open_dir(dir);
  uint64_t total = 0;
  for (const auto& name : index.names()) {
    const auto& info = index.info(name);
    total += std::max<uint64_t>(info.nbytes(), info.numel() * at::elementSize(dtype));
  }
  return total;
}

// Whether this rank runs a text encoder before its ring phase.
bool encodes_here(const RunContext& run) {
  const int rank = run.world.rank();
  if (!run.encoders_on_their_ranks()) return run.world.is_coordinator() && !run.checkpoints().resume;
  return rank == run.components.clip.rank || rank == run.components.t5.rank;
}

// What the overlap holds on this rank's device: the encoders that run here (not those the map puts on the CPU)
// and this rank's blocks (not those it offloads).
struct OverlapMemory {
  uint64_t encoders = 0;
  uint64_t blocks = 0;
  // Blocks that may load while the encoders hold the device. The staged order peaks at the blocks plus the
  // loop's activations; with the encoders' weights and their working memory (a warm-up block of zeros and the
  // forward's activations, taken as an eighth of their weights) beside the early blocks, the overlap stays under it.
  uint64_t early_blocks() const {
    const uint64_t encoders_in_use = encoders + encoders / 8;
    return blocks > encoders_in_use ? blocks - encoders_in_use : 0;
  }
};

OverlapMemory overlap_memory(const RunContext& run, const placement::RankStage& mine) {
  OverlapMemory memory;
  const int rank = run.world.rank();
  for (const ComponentPlace* place : {&run.components.clip, &run.components.t5}) {
    if ((place->rank == rank || !run.encoders_on_their_ranks()) && !place->on_cpu)
      memory.encoders += component_bytes(run.flux.folder().component(place->name).path, run.request.dtype);
  }
  std::map<int64_t, models::OffloadedWeights> offloaded = offloaded_weights(mine);
  memory.blocks = pipeline::FluxStage::device_weight_bytes(run.transformer_dir, mine.first_block, mine.last_block,
                                                           offloaded);
  return memory;
}

std::string bytes_text(uint64_t bytes) { return human_size(static_cast<double>(bytes)); }

// How the overlap shares the device, for the log and the report.
std::string overlap_terms(const OverlapMemory& memory) {
  return str(bytes_text(memory.early_blocks()), " of this rank's ", bytes_text(memory.blocks),
             " of blocks load while the text encoders (", bytes_text(memory.encoders),
             ") hold the device, the rest once they are released, so the peak stays the staged order's");
}

}  // namespace

LoadOverlap choose_load_overlap(const RunContext& run) {
  const std::string& mode = run.options.load_overlap;
  DP_CHECK(mode == "auto" || mode == "on" || mode == "off", "--load-overlap must be auto, on or off, got '", mode, "'");
  const placement::RankStage* mine = run.layout().stage_of(run.world.rank());
  if (mine == nullptr) return {false, "this rank holds no transformer blocks"};
  if (!encodes_here(run)) return {false, "no text encoder runs on this rank: its blocks load while the encoders run on their ranks"};
  if (mode == "off") return {false, "--load-overlap off"};
  const OverlapMemory memory = overlap_memory(run, *mine);
  if (mode == "on") return {true, "--load-overlap on: " + overlap_terms(memory), memory.early_blocks()};
  if (!run.device.is_cuda()) return {false, "on the CPU the loader and the encoders would share the same cores"};
  if (!run.options.max_memory.empty())
    return {false, "--max-memory caps this rank: the staged order keeps the encoders' and the blocks' memory apart"};
  if (memory.early_blocks() == 0)
    return {false, str("the text encoders (", bytes_text(memory.encoders), ") leave no room for blocks (",
                       bytes_text(memory.blocks), ") within the staged order's peak")};
  // Measured on an H200 with its own stream and the early allowance (bench/RESULTS.md, 2026-12-05): 6.16 s of
  // process wall for one 1024x1024 image against 6.21 and 6.27 s staged, inside the run-to-run spread, and
  // T5's load slows beside the blocks'; on an H100 after the first-use work, 6.37 s to the PNG against 6.13-6.20 s
  // staged. Auto keeps the staged order; the overlap is there to measure and use.
  return {false, "the overlap (" + overlap_terms(memory) + ") measured no faster than the staged order on an H200 "
                 "(--load-overlap on to use it)"};
}

void start_load_overlap(RunContext& run) {
  const LoadOverlap choice = choose_load_overlap(run);
  DP_INFO("rank ", run.world.rank(), ": load overlap ", choice.overlap ? "on" : "off", ": ", choice.reason);
  run.load_overlapped = choice.overlap;
  run.load_overlap_reason = choice.reason;
  if (!choice.overlap) return;
  // Bounded like every wait of a run: by the encode phase, which lifts the budget however it ends
  // (encoders_released, and RunContext's destructor).
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(
      std::max(600.0, run.options.transport_timeout_seconds) * 1000));
  run.load_budget = std::make_shared<io::LoadBudget>(choice.early_bytes, "the text encoders to release the device",
                                                     timeout);
  run.encoder_weights_gate =
      std::make_shared<io::LoadBudget>(0, "the text encoders' weights to be on the device", timeout);
  run.early_load = std::async(std::launch::async, [&run, budget = run.load_budget, gate = run.encoder_weights_gate] {
    // Both are per thread: the blocks must land on this rank's GPU and be inference tensors like the rest.
    c10::InferenceMode inference;
    c10::OptionalDeviceGuard device_guard;
    if (run.device.is_cuda()) device_guard.reset_device(run.device);
    // One load at a time reads fastest: beside T5's, the two took 17 GB/s together on an H200 where one alone
    // took 30-35 GB/s, and CLIP's forward slowed from 0.56 to 0.87 s (bench/RESULTS.md, 2026-12-05).
    const double waited = gate->wait_for_lift();
    DP_DEBUG("rank ", run.world.rank(), ": the overlapped load waited ", std::fixed, std::setprecision(3), waited,
             " s for the text encoders' weights");
    const io::ScopedLoadBudget scoped(budget.get());
    return on_loader_stream(run.device, [&run] { return load_phase(run, trace::Track::background_load); });
  });
}

void encoder_weights_loaded(RunContext& run) {
  if (run.encoder_weights_gate) run.encoder_weights_gate->lift();
}

void encoders_released(RunContext& run) {
  encoder_weights_loaded(run);
  if (!run.load_budget) return;
  // The encoders' cached segments go first, so that the blocks still to load take their place.
  pipeline::release_cached_memory(run.device);
  run.load_budget->lift();
}

LoadedStage take_loaded_stage(RunContext& run) {
  if (!run.early_load.valid()) {
    const placement::RankStage* mine = run.layout().stage_of(run.world.rank());
    if (mine != nullptr && warms_up_beside_the_load(run, *mine)) return load_warming_up_beside(run, *mine);
    return load_phase(run);
  }
  LoadedStage loaded = run.early_load.get();
  // The loader thread's warm-up loaded the kernels for the whole process, but cuBLAS, cuDNN and their plan
  // caches are per thread in LibTorch: once more here, on the thread that runs the loop, now cheap.
  if (run.options.warm_up && loaded.stage && run.device.is_cuda())
    warm_up(run, {loaded.stage.get()}, " on the loop's thread");
  return loaded;
}

void log_offload(const RunContext& run, const pipeline::FluxStage* stage) {
  if (stage == nullptr) return;
  const auto stats = stage->offload_stats();
  if (stats.copies == 0) return;
  DP_INFO("rank ", run.world.rank(), ": ", stats.blocks, " offloaded block(s) streamed in ", stats.copies, " copies, ",
          std::fixed, std::setprecision(1), stats.bytes / 1e6, " MB, ", std::setprecision(3), stats.copy_seconds,
          " s of copy time on the side stream (", std::setprecision(1), stats.host_bytes / 1e6, " MB pinned on the host)");
}

}  // namespace dp::runtime
