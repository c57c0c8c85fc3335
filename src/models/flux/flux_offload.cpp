#include "models/flux/flux_offload.h"

#include <optional>
#include <string>

#include "core/error.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace dp::models {
namespace {

std::string block_key(const FluxConfig& config, int64_t block) {
  return block < config.num_layers ? "transformer_blocks." + std::to_string(block)
                                   : "single_transformer_blocks." + std::to_string(block - config.num_layers);
}

}  // namespace

#ifdef DIFFPIPE_HAVE_CUDA

struct OffloadedBlocks::Slot {
  int64_t block = -1;
  std::optional<flux::DoubleBlock> double_block;
  std::optional<flux::SingleBlock> single_block;
  uint64_t bytes = 0;
  // Timing-enabled (cudaEventDefault) so the copy time can be read once `copied` has completed.
  at::cuda::CUDAEvent copy_started{cudaEventDefault};
  at::cuda::CUDAEvent copied{cudaEventDefault};
  at::cuda::CUDAEvent done{cudaEventDisableTiming};  // recorded after the compute that used this slot
  bool copy_untimed = false;                          // copied, time not yet added to the stats
  bool used = false;                                  // `done` was recorded since the last fill
  std::optional<c10::cuda::CUDAStream> side;          // where the copies run (the same stream for both slots)
};

OffloadedBlocks::OffloadedBlocks(const ModuleWeights& root, const FluxConfig& config,
                                 std::map<int64_t, OffloadedWeights> blocks)
    : root_(root), config_(config), blocks_(std::move(blocks)) {
  DP_CHECK(root_.device().is_cuda(), "offloaded blocks are streamed to a CUDA device; on ", root_.device(),
           " they are simply resident");
  stats_.blocks = static_cast<int64_t>(blocks_.size());
  // pinned_host: built once on the host through the same loader as a resident block, then pinned so that a
  // use is an asynchronous DMA of the converted bytes.
  const ModuleWeights host_root =
      ModuleWeights(root_.index_ptr(), root_.dtype(), at::kCPU, root_.prefix()).with_lora(root_.lora());
  const flux::TensorMap pin = [](const at::Tensor& t) { return t.contiguous().pin_memory(); };
  for (const auto& [block, where] : blocks_) {
    DP_CHECK(block >= 0 && block < config_.num_blocks(), "offloaded block ", block, " is outside the model's ",
             config_.num_blocks(), " blocks");
    if (where != OffloadedWeights::pinned_host) continue;
    const ModuleWeights scope = host_root.child(block_key(config_, block));
    if (block < config_.num_layers) {
      const auto built = flux::DoubleBlock::load(scope, config_).map(pin);
      stats_.host_bytes += built.nbytes();
      host_double_.emplace(block, built);
    } else {
      const auto built = flux::SingleBlock::load(scope, config_).map(pin);
      stats_.host_bytes += built.nbytes();
      host_single_.emplace(block, built);
    }
  }
  const auto side = at::cuda::getStreamFromPool(/*isHighPriority=*/false, root_.device().index());
  for (auto& slot : slots_) {
    slot = std::make_unique<Slot>();
    slot->side = side;
  }
}

OffloadedBlocks::~OffloadedBlocks() {
  // The slots' weights may still be read by queued compute; the pinned sources by queued copies.
  for (auto& slot : slots_) {
    if (!slot) continue;
    try {
      if (slot->used) slot->done.synchronize();
      if (slot->block >= 0) slot->copied.synchronize();
    } catch (...) {
      // A failed device is reported by whoever used it; a destructor must not throw.
    }
  }
}

int64_t OffloadedBlocks::next_after(int64_t block) const {
  auto it = blocks_.upper_bound(block);
  return it == blocks_.end() ? blocks_.begin()->first : it->first;
}

// Empties a slot: waits (on the host) for the compute that read it, so its memory can be reused at once.
void OffloadedBlocks::retire(Slot& slot) {
  if (slot.used) slot.done.synchronize();
  if (slot.copy_untimed) {
    slot.copied.synchronize();
    stats_.copy_seconds += slot.copy_started.elapsed_time(slot.copied) / 1e3;
    slot.copy_untimed = false;
  }
  slot.double_block.reset();
  slot.single_block.reset();
  slot.block = -1;
  slot.used = false;
}

OffloadedBlocks::Slot& OffloadedBlocks::fill(int64_t block) {
  // The slot that did not run last: the other one may still be computing.
  const int index = last_used_ == 0 ? 1 : 0;
  Slot& slot = *slots_[index];
  retire(slot);
  const at::Device device = root_.device();
  const c10::cuda::CUDAStreamGuard side(*slot.side);
  const auto stream = at::cuda::getCurrentCUDAStream(device.index());
  slot.copy_started.record(stream);
  const auto where = blocks_.at(block);
  const flux::TensorMap to_device = [&](const at::Tensor& t) { return t.to(device, /*non_blocking=*/true); };
  if (block < config_.num_layers) {
    slot.double_block = where == OffloadedWeights::pinned_host
                            ? host_double_.at(block).map(to_device)
                            : flux::DoubleBlock::load(root_.child(block_key(config_, block)), config_);
    slot.bytes = slot.double_block->nbytes();
  } else {
    slot.single_block = where == OffloadedWeights::pinned_host
                            ? host_single_.at(block).map(to_device)
                            : flux::SingleBlock::load(root_.child(block_key(config_, block)), config_);
    slot.bytes = slot.single_block->nbytes();
  }
  slot.copied.record(stream);
  slot.copy_untimed = true;
  slot.block = block;
  stats_.copies += 1;
  stats_.bytes += slot.bytes;
  return slot;
}

void OffloadedBlocks::forward(int64_t block, at::Tensor& image, at::Tensor& text, const at::Tensor& temb,
                              const flux::RotaryTables& rope) {
  DP_CHECK(holds(block), "block ", block, " is not offloaded");
  Slot* slot = nullptr;
  for (int i = 0; i < 2; ++i)
    if (slots_[i]->block == block) slot = slots_[i].get();
  if (slot == nullptr) slot = &fill(block);  // not prefetched: the first use, or a partial range
  const auto compute = at::cuda::getCurrentCUDAStream(root_.device().index());
  slot->copied.block(compute);
  if (slot->double_block) {
    slot->double_block->forward(image, text, temb, rope);
  } else {
    slot->single_block->forward(image, text, temb, rope);
  }
  slot->done.record(compute);
  slot->used = true;
  last_used_ = slot == slots_[0].get() ? 0 : 1;
  // The compute above is queued; copying the next block now overlaps it (a copy from the mmapped file blocks
  // this thread, never the GPU).
  const int64_t next = next_after(block);
  if (next != block && slots_[0]->block != next && slots_[1]->block != next) fill(next);
}

OffloadStats OffloadedBlocks::stats() {
  for (auto& slot : slots_) {
    if (!slot->copy_untimed) continue;
    slot->copied.synchronize();
    stats_.copy_seconds += slot->copy_started.elapsed_time(slot->copied) / 1e3;
    slot->copy_untimed = false;
  }
  return stats_;
}

#else  // no CUDA in this build: offloaded blocks are resident wherever they run

struct OffloadedBlocks::Slot {};

OffloadedBlocks::OffloadedBlocks(const ModuleWeights& root, const FluxConfig& config,
                                 std::map<int64_t, OffloadedWeights> blocks)
    : root_(root), config_(config), blocks_(std::move(blocks)) {
  DP_FAIL("offloaded blocks are streamed to a CUDA device, and this build has no CUDA support");
}
OffloadedBlocks::~OffloadedBlocks() = default;
int64_t OffloadedBlocks::next_after(int64_t block) const { return block; }
void OffloadedBlocks::retire(Slot&) {}
OffloadedBlocks::Slot& OffloadedBlocks::fill(int64_t) { DP_FAIL("no CUDA support"); }
void OffloadedBlocks::forward(int64_t, at::Tensor&, at::Tensor&, const at::Tensor&, const flux::RotaryTables&) {
  DP_FAIL("no CUDA support");
}
OffloadStats OffloadedBlocks::stats() { return stats_; }

#endif

}  // namespace dp::models
