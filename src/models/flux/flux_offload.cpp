#include "models/flux/flux_offload.h"

#include <chrono>
#include <functional>
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

// A host copy that starts at the same offset within a 64-byte line as its source. CPU kernels choose their
// path by alignment: MKL's one-row matrix-vector product (a microbatch of one through a block's modulation
// Linear) sums in another order for a weight that starts 4 bytes into a line than for one on a line boundary.
// Resident weights are views of the mapped file, at whatever offset the file puts them; a streamed block's
// copy at the same offset computes the same bits.
at::Tensor host_copy_keeping_alignment(const at::Tensor& source) {
  constexpr int64_t kLine = 64;
  const at::Tensor contiguous = source.contiguous();
  const int64_t element = static_cast<int64_t>(contiguous.element_size());
  const auto source_offset = static_cast<int64_t>(reinterpret_cast<uintptr_t>(contiguous.data_ptr()) % kLine);
  if (contiguous.numel() == 0 || source_offset % element != 0) return contiguous.clone(at::MemoryFormat::Contiguous);
  const at::Tensor buffer = at::empty({contiguous.numel() + kLine / element}, contiguous.options());
  const auto buffer_offset = static_cast<int64_t>(reinterpret_cast<uintptr_t>(buffer.data_ptr()) % kLine);
  const int64_t shift = ((source_offset - buffer_offset + kLine) % kLine) / element;
  at::Tensor copy = buffer.narrow(0, shift, contiguous.numel()).view(contiguous.sizes());
  copy.copy_(contiguous);
  return copy;
}

// The device side of one slot: the order between its copy and the compute that reads it, and the copy's time.
class SlotEvents {
 public:
  virtual ~SlotEvents() = default;
  virtual void copy_begins() = 0;             // on the copy stream, before the copy is issued
  virtual void copy_ends() = 0;               // on the copy stream, after it
  virtual void compute_waits_for_copy() = 0;  // the compute stream will not read the slot before the copy ends
  virtual void compute_recorded() = 0;        // after the compute that read the slot was issued
  virtual void wait_for_compute() = 0;        // the host waits until that compute has finished
  virtual double copy_seconds() = 0;          // waits for the copy to end; how long it took
};

// Where offloaded blocks are streamed to: a CUDA GPU (side stream, events, pinned memory) or the host.
class OffloadTarget {
 public:
  virtual ~OffloadTarget() = default;
  virtual std::unique_ptr<SlotEvents> slot_events() = 0;
  // How a pinned_host block, built once on the host, is kept between uses.
  virtual at::Tensor keep(const at::Tensor& t) = 0;
  // One use's copy of a kept tensor onto the device, into memory of its own.
  virtual at::Tensor copy_in(const at::Tensor& t) = 0;
  // Runs `issue` (the copy, or a load from the mapped file) where copies run.
  virtual void on_copy_stream(const std::function<void()>& issue) = 0;
};

namespace {

// The host as the "device": everything runs in program order on the calling thread, so the compute always
// sees a finished copy and a slot is always free once its compute has returned; the copy time is the host's.
class HostSlotEvents final : public SlotEvents {
 public:
  void copy_begins() override { started_ = std::chrono::steady_clock::now(); }
  void copy_ends() override { seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(); }
  void compute_waits_for_copy() override {}
  void compute_recorded() override {}
  void wait_for_compute() override {}
  double copy_seconds() override { return seconds_; }

 private:
  std::chrono::steady_clock::time_point started_;
  double seconds_ = 0;
};

class HostTarget final : public OffloadTarget {
 public:
  std::unique_ptr<SlotEvents> slot_events() override { return std::make_unique<HostSlotEvents>(); }
  at::Tensor keep(const at::Tensor& t) override { return t.contiguous(); }
  at::Tensor copy_in(const at::Tensor& t) override { return host_copy_keeping_alignment(t); }
  void on_copy_stream(const std::function<void()>& issue) override { issue(); }
};

#ifdef DIFFPIPE_HAVE_CUDA
class CudaSlotEvents final : public SlotEvents {
 public:
  explicit CudaSlotEvents(at::Device device) : device_(device) {}
  void copy_begins() override { copy_started_.record(at::cuda::getCurrentCUDAStream(device_.index())); }
  void copy_ends() override { copied_.record(at::cuda::getCurrentCUDAStream(device_.index())); }
  void compute_waits_for_copy() override { copied_.block(at::cuda::getCurrentCUDAStream(device_.index())); }
  void compute_recorded() override { done_.record(at::cuda::getCurrentCUDAStream(device_.index())); }
  void wait_for_compute() override { done_.synchronize(); }
  double copy_seconds() override {
    copied_.synchronize();
    return copy_started_.elapsed_time(copied_) / 1e3;
  }

 private:
  at::Device device_;
  // Timing-enabled (cudaEventDefault) so the copy time can be read once `copied_` has completed.
  at::cuda::CUDAEvent copy_started_{cudaEventDefault};
  at::cuda::CUDAEvent copied_{cudaEventDefault};
  at::cuda::CUDAEvent done_{cudaEventDisableTiming};  // recorded after the compute that used the slot
};

class CudaTarget final : public OffloadTarget {
 public:
  explicit CudaTarget(at::Device device)
      : device_(device), side_(at::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}
  std::unique_ptr<SlotEvents> slot_events() override { return std::make_unique<CudaSlotEvents>(device_); }
  // Pinned, so that a use is an asynchronous DMA of the converted bytes.
  at::Tensor keep(const at::Tensor& t) override { return t.contiguous().pin_memory(); }
  at::Tensor copy_in(const at::Tensor& t) override { return t.to(device_, /*non_blocking=*/true); }
  void on_copy_stream(const std::function<void()>& issue) override {
    const c10::cuda::CUDAStreamGuard guard(side_);  // the same side stream for both slots
    issue();
  }

 private:
  at::Device device_;
  c10::cuda::CUDAStream side_;
};
#endif

std::unique_ptr<OffloadTarget> make_target(const at::Device& device) {
  if (device.is_cpu()) return std::make_unique<HostTarget>();
#ifdef DIFFPIPE_HAVE_CUDA
  if (device.is_cuda()) return std::make_unique<CudaTarget>(device);
#endif
  DP_FAIL("offloaded blocks stream to a CUDA device or to the CPU; this build cannot stream them to ", device);
}

}  // namespace

struct OffloadedBlocks::Slot {
  int64_t block = -1;
  std::optional<flux::DoubleBlock> double_block;
  std::optional<flux::SingleBlock> single_block;
  uint64_t bytes = 0;
  std::unique_ptr<SlotEvents> events;
  bool copy_untimed = false;  // copied, time not yet added to the stats
  bool used = false;          // the compute that read it was recorded since the last fill
};

OffloadedBlocks::OffloadedBlocks(const ModuleWeights& root, const FluxConfig& config,
                                 std::map<int64_t, OffloadedWeights> blocks)
    : root_(root), config_(config), target_(make_target(root.device())), blocks_(std::move(blocks)) {
  stats_.blocks = static_cast<int64_t>(blocks_.size());
  // pinned_host: built once on the host through the same loader as a resident block (adapters merged or attached
  // as for a resident block), then kept as the target keeps it (pinned for a GPU).
  const ModuleWeights host_root =
      ModuleWeights(root_.index_ptr(), root_.dtype(), at::kCPU, root_.prefix()).with_lora(root_.lora());
  const flux::TensorMap keep = [this](const at::Tensor& t) { return target_->keep(t); };
  const bool pinned = root_.device().is_cuda();
  for (const auto& [block, where] : blocks_) {
    DP_CHECK(block >= 0 && block < config_.num_blocks(), "offloaded block ", block, " is outside the model's ",
             config_.num_blocks(), " blocks");
    if (where != OffloadedWeights::pinned_host) continue;
    const ModuleWeights scope = host_root.child(block_key(config_, block));
    if (block < config_.num_layers) {
      const auto built = flux::DoubleBlock::load(scope, config_).map(keep);
      if (pinned) stats_.host_bytes += built.nbytes();
      host_double_.emplace(block, built);
    } else {
      const auto built = flux::SingleBlock::load(scope, config_).map(keep);
      if (pinned) stats_.host_bytes += built.nbytes();
      host_single_.emplace(block, built);
    }
  }
  for (auto& slot : slots_) {
    slot = std::make_unique<Slot>();
    slot->events = target_->slot_events();
  }
}

OffloadedBlocks::~OffloadedBlocks() {
  // The slots' weights may still be read by queued compute; the pinned sources by queued copies.
  for (auto& slot : slots_) {
    if (!slot) continue;
    try {
      if (slot->used) slot->events->wait_for_compute();
      if (slot->block >= 0) slot->events->copy_seconds();
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
  if (slot.used) slot.events->wait_for_compute();
  if (slot.copy_untimed) {
    stats_.copy_seconds += slot.events->copy_seconds();
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
  const auto where = blocks_.at(block);
  const flux::TensorMap copy_in = [this](const at::Tensor& t) { return target_->copy_in(t); };
  target_->on_copy_stream([&] {
    slot.events->copy_begins();
    if (block < config_.num_layers) {
      slot.double_block = where == OffloadedWeights::pinned_host
                              ? host_double_.at(block).map(copy_in)
                              : flux::DoubleBlock::load(root_.child(block_key(config_, block)), config_);
      slot.bytes = slot.double_block->nbytes();
    } else {
      slot.single_block = where == OffloadedWeights::pinned_host
                              ? host_single_.at(block).map(copy_in)
                              : flux::SingleBlock::load(root_.child(block_key(config_, block)), config_);
      slot.bytes = slot.single_block->nbytes();
    }
    slot.events->copy_ends();
  });
  slot.copy_untimed = true;
  slot.block = block;
  stats_.copies += 1;
  stats_.bytes += slot.bytes;
  return slot;
}

void OffloadedBlocks::forward(int64_t block, at::Tensor& image, at::Tensor& text, const at::Tensor& temb,
                              const flux::RotaryTables& rope, const flux::SequenceShard* shard) {
  DP_CHECK(holds(block), "block ", block, " is not offloaded");
  Slot* slot = nullptr;
  for (int i = 0; i < 2; ++i)
    if (slots_[i]->block == block) slot = slots_[i].get();
  if (slot == nullptr) slot = &fill(block);  // not prefetched: the first use, or a partial range
  slot->events->compute_waits_for_copy();
  if (slot->double_block) {
    slot->double_block->forward(image, text, temb, rope, shard);
  } else {
    slot->single_block->forward(image, text, temb, rope, shard);
  }
  slot->events->compute_recorded();
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
    stats_.copy_seconds += slot->events->copy_seconds();
    slot->copy_untimed = false;
  }
  return stats_;
}

}  // namespace dp::models
