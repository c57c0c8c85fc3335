#include "runtime/load_phase.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <chrono>
#include <iomanip>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "core/human_units.h"
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

LoadedStage load_phase(const RunContext& run) {
  LoadedStage loaded;
  const placement::RankStage* mine = run.layout().stage_of(run.world.rank());
  if (mine == nullptr) return loaded;
  const auto started = std::chrono::steady_clock::now();
  const std::string phase = str("loading blocks [", mine->first_block, ", ", mine->last_block, ")");
  loaded.stage = pipeline::run_phase(run.world.rank(), phase, [&] {
    return std::make_shared<pipeline::FluxStage>(run.transformer_dir, mine->first_block, mine->last_block,
                                                 run.request.dtype, run.device, run.grid,
                                                 run.request.max_sequence_length, offloaded_weights(*mine),
                                                 sequence_shard(run), run.request.lora);
  });
  loaded.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  loaded.bytes = loaded.stage->weight_bytes();
  DP_INFO("rank ", run.world.rank(), ": loaded blocks [", mine->first_block, ", ", mine->last_block, "): ",
          human_size(static_cast<double>(loaded.bytes)), " in ", human_seconds(loaded.seconds), " (",
          human_size(loaded.seconds > 0 ? loaded.bytes / loaded.seconds : 0.0), "/s)");
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
