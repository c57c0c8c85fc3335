#pragma once
// Choosing the microbatch size: larger microbatches run their GEMMs more efficiently, but a run of B images
// then has fewer microbatches to keep the ring's stages busy (with fewer microbatches than stages, stages
// idle), and each stage needs more activation memory. For every candidate size the "pipeline" split is planned
// under the memory caps and the denoising ring simulated (ring_simulator.h); the size with the most images/s
// wins, a smaller one when within 1% (less latency, less memory).
//
// A microbatch's time: calibrated times at exactly that size when `diffpipe calibrate` measured it; else the
// calibrated times of the nearest smaller measured size scaled by the images and the efficiency curve; else
// the FLOP model (which assumes full efficiency) divided by the curve's efficiency.
#include <string>
#include <utility>
#include <vector>

#include "placement/calibration.h"
#include "placement/ring_simulator.h"
#include "placement/stage_timing.h"

namespace dp::placement {

// Per-image efficiency of a microbatch of m images, relative to the best size (1 = as cheap per image as any).
struct EfficiencyCurve {
  std::vector<std::pair<int64_t, double>> points;  // ascending in m, efficiency in (0, 1]
  std::string source;
  // Linear between points, the end points' values beyond them.
  double at(int64_t microbatch) const;
};

// The stated default when nothing was calibrated: per-image cost 1 + 0.15 / m of the large-batch cost
// (launch overheads and the modulation GEMVs a microbatch pays once). bench/RESULTS.md (2026-12-04) measured
// 130.4 ms per image-step for 1-image microbatches against about 129.6 for one GPU's 4-image batch at 768x1360
// on an H200, so the true curve is flatter there; it is steeper on small shapes.
EfficiencyCurve default_efficiency_curve();
// From calibration entries of several microbatch sizes for the key's device, dtype and shape; the default
// curve when fewer than two sizes were measured.
EfficiencyCurve efficiency_curve(const std::vector<CalibrationEntry>& entries, const CalibrationKey& key);

struct MicrobatchRequest {
  models::FluxConfig config;
  const ModuleTree* tree = nullptr;  // sized at the run dtype
  // --fp8-gemms: the same tree with the blocks' projections at FP8 sizes (BlockWeights::fp8_gemms). Candidates
  // are planned at these sizes, as make_plan plans the run (under CUDA caps each GPU keeps `tree`'s largest
  // block free for the conversion).
  const ModuleTree* fp8_tree = nullptr;
  MaxMemory max_memory;  // the GPUs of the world (stage groups) with their budgets
  TimingModel timing;    // height, width, text tokens; batch and calibrated are set per candidate
  io::DType dtype = io::DType::BF16;
  bool cuda_caps = false;
  int64_t images = 1;
  int steps = 28;
  double euler_ms = 0.1;
  LinkModel link;
  EfficiencyCurve curve;
  std::vector<CalibrationEntry> calibrations;  // of the run's device, dtype and shape (others are ignored)
  CalibrationKey key;                          // microbatch ignored
  int64_t max_microbatch = 16;
};

struct MicrobatchCandidate {
  int64_t size = 1;
  bool fits = false;
  std::string why_not;  // when it does not fit the memory caps
  double images_per_s = 0;
  double max_stage_ms = 0;
  std::string times;  // "calibrated", "calibrated at 2, scaled", "FLOPs / curve"
};

struct MicrobatchChoice {
  int64_t size = 1;
  std::vector<MicrobatchCandidate> candidates;
  std::string reason;  // one line: what was chosen and why
};

// Candidates 1, 2, 4 ... up to min(images, max_microbatch), and `images` itself when below that bound.
// Throws when no candidate fits the memory caps (naming the smallest one's reason).
MicrobatchChoice choose_microbatch(const MicrobatchRequest& request);

}  // namespace dp::placement
