#pragma once
// Synchronisation and peak-memory figures for timing and reports, on CPU or CUDA.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace dp::pipeline {

// Waits for queued device work, so that host clocks measure it.
void synchronize(const at::Device& device);
// What calibrations are keyed by: the GPU's name as CUDA reports it ("NVIDIA H200"), or on CPU
// "cpu (N threads)" with LibTorch's intra-op thread count, which sets the CPU's speed as much as the chip.
std::string device_name(const at::Device& device);
// Peak bytes allocated by LibTorch's caching allocator on a CUDA device since the last reset; on CPU, the
// process's peak resident set size (core/memory_stats).
uint64_t peak_memory_bytes(const at::Device& device);
void reset_peak_memory(const at::Device& device);
// Peak bytes the caching allocator reserved from the driver on a CUDA device (what --max-memory caps); 0 on CPU.
uint64_t peak_reserved_bytes(const at::Device& device);
// Returns the caching allocator's unused segments to the driver (CUDA; nothing on CPU). Between phases, so that
// the next phase's tensors do not fill segments the previous phase's tensors split, which the cap would count.
void release_cached_memory(const at::Device& device);

}  // namespace dp::pipeline
