#pragma once
// Transformer blocks that a device map offloads ("cpu" or "disk") but that still run on a GPU, as accelerate
// runs offloaded modules: their weights wait off the GPU between uses and are copied in per use.
//   pinned_host: the block is built once on the host (the same dtype conversion and q/k/v concatenation a
//                resident block gets, which LibTorch performs on the CPU for a blocking host-to-device copy)
//                and kept in pinned memory; a use is an asynchronous copy of those bytes.
//   mapped_file: nothing is kept; a use loads the block from the mmapped safetensors file exactly as a
//                resident block is loaded, on a side stream.
// Double buffering: two slots on the GPU. While block b computes on the caller's stream, the next offloaded
// block is copied on a side stream into the other slot; events order the two streams, and a slot is refilled
// only after the host has seen the compute that used it finish, so the GPU never holds more than two
// offloaded blocks. The next block after the last one is the first one again: the copy for the next step
// overlaps the rest of this step. With one or two offloaded blocks, both stay in their slots.
// On the CPU the same code streams to a host "device": a pinned_host block is kept once (unpinned) and each
// use copies it into a buffer of its own, a mapped_file block is loaded per use, and the ordering is program
// order. Nothing is gained there; it exists so that the streaming logic (slots, prefetch, wrap-around) runs
// in every CPU test against the resident blocks, instead of only on a GPU.
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>

#include "models/flux/flux_blocks.h"
#include "models/flux/flux_config.h"
#include "models/module_weights.h"

namespace dp::models {

enum class OffloadedWeights { pinned_host, mapped_file };

struct OffloadStats {
  int64_t copies = 0;        // block copies to the device
  uint64_t bytes = 0;        // bytes those copies moved
  double copy_seconds = 0;   // time of the copies: side-stream time on CUDA (events), host clock on the CPU
  int64_t blocks = 0;        // offloaded blocks
  uint64_t host_bytes = 0;   // pinned host memory holding pinned_host blocks (none on the CPU: not pinned)
};

// How the blocks reach the device they run on (a CUDA GPU, or the host): flux_offload.cpp.
// A copy of `source` in host memory of its own that starts at the same offset within a 64-byte line, so that
// CPU kernels, which choose their path by alignment, give it the bits they give the source (a streamed block's
// weights against the same weights resident as views of the mapped file).
at::Tensor host_copy_keeping_alignment(const at::Tensor& source);

class OffloadTarget;

class OffloadedBlocks {
 public:
  // `root` reads the transformer's checkpoint at the run dtype for the device the blocks run on (CUDA or CPU).
  OffloadedBlocks(const ModuleWeights& root, const FluxConfig& config, std::map<int64_t, OffloadedWeights> blocks);
  ~OffloadedBlocks();
  OffloadedBlocks(const OffloadedBlocks&) = delete;
  OffloadedBlocks& operator=(const OffloadedBlocks&) = delete;

  bool holds(int64_t block) const { return blocks_.count(block) != 0; }
  // Runs offloaded block `block` on the current stream (copying its weights in first unless prefetched), then
  // starts the copy of the next offloaded block.
  void forward(int64_t block, at::Tensor& image, at::Tensor& text, const at::Tensor& temb,
               const flux::RotaryTables& rope, const flux::SequenceShard* shard = nullptr);
  // Waits for the copies in flight, so the times are complete.
  OffloadStats stats();

 private:
  struct Slot;
  Slot& fill(int64_t block);
  int64_t next_after(int64_t block) const;
  void retire(Slot& slot);

  ModuleWeights root_;
  FluxConfig config_;
  std::unique_ptr<OffloadTarget> target_;
  std::map<int64_t, OffloadedWeights> blocks_;
  std::map<int64_t, flux::DoubleBlock> host_double_;  // pinned_host blocks, built once
  std::map<int64_t, flux::SingleBlock> host_single_;
  std::unique_ptr<Slot> slots_[2];
  int last_used_ = -1;  // the slot of the block that ran last
  OffloadStats stats_;
};

}  // namespace dp::models
