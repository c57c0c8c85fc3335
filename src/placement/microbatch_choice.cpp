#include "placement/microbatch_choice.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "placement/flux_module_tree.h"
#include "placement/ring_stages.h"

namespace dp::placement {

double EfficiencyCurve::at(int64_t microbatch) const {
  DP_CHECK(!points.empty(), "an efficiency curve needs at least one point");
  if (microbatch <= points.front().first) return points.front().second;
  if (microbatch >= points.back().first) return points.back().second;
  for (std::size_t i = 1; i < points.size(); ++i) {
    const auto& [m1, e1] = points[i];
    if (microbatch > m1) continue;
    const auto& [m0, e0] = points[i - 1];
    return e0 + (e1 - e0) * static_cast<double>(microbatch - m0) / static_cast<double>(m1 - m0);
  }
  return points.back().second;
}

EfficiencyCurve default_efficiency_curve() {
  EfficiencyCurve curve;
  curve.source = "the default curve (per-image cost 1 + 0.15/m; calibrate several --microbatch-size for a measured one)";
  for (int64_t m = 1; m <= 4096; m *= 2) curve.points.emplace_back(m, 1.0 / (1.0 + 0.15 / static_cast<double>(m)));
  return curve;
}

EfficiencyCurve efficiency_curve(const std::vector<CalibrationEntry>& entries, const CalibrationKey& key) {
  EfficiencyCurve curve;
  curve.points = calibrated_efficiency_curve(entries, key);
  if (curve.points.empty()) return default_efficiency_curve();
  std::string sizes;
  for (const auto& [m, e] : curve.points) sizes += str(sizes.empty() ? "" : ", ", m);
  curve.source = str("calibrated at microbatch ", sizes, " on ", key.device.empty() ? std::string("the device") : key.device);
  return curve;
}

namespace {

CalibratedTimes scaled(const CalibratedTimes& t, double factor) {
  return {t.embedders_ms * factor, t.double_block_ms * factor, t.single_block_ms * factor, t.output_ms * factor};
}

bool same_run(const CalibrationKey& a, const CalibrationKey& b) {
  return (b.device.empty() || a.device == b.device) && a.dtype == b.dtype && a.height == b.height &&
         a.width == b.width && a.text_tokens == b.text_tokens;
}

nlohmann::ordered_json map_json(const DeviceMap& map) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [key, device] : map) out[key] = to_json_value(device);
  return out;
}

// The "pipeline" split of one candidate, at FP8 block sizes when the request has them, as make_plan plans the run.
PipelinePlacement plan_candidate(const MicrobatchRequest& r, const TimingModel& timing) {
  if (r.fp8_tree == nullptr) return plan_pipeline(r.config, *r.tree, r.max_memory, timing, r.dtype, r.cuda_caps);
  const MaxMemory budgets =
      r.cuda_caps ? r.max_memory.less_on_gpus(flux_largest_block_bytes(r.config, *r.tree)) : r.max_memory;
  return plan_pipeline(r.config, *r.fp8_tree, budgets, timing, r.dtype, r.cuda_caps);
}

MicrobatchCandidate simulate_candidate(const MicrobatchRequest& r, int64_t m) {
  MicrobatchCandidate c;
  c.size = m;
  TimingModel timing = r.timing;
  timing.batch = m;
  timing.calibrated.reset();
  // The calibration of exactly m, else of the largest measured size below m (the smallest above when none).
  std::map<int64_t, const CalibrationEntry*> measured;
  for (const auto& e : r.calibrations)
    if (same_run(e.key, r.key)) measured[e.key.microbatch] = &e;
  double flop_scale = 1.0;
  if (!measured.empty()) {
    auto it = measured.upper_bound(m);
    const CalibrationEntry* base = it == measured.begin() ? it->second : std::prev(it)->second;
    const int64_t m0 = base->key.microbatch;
    const double factor = static_cast<double>(m) / static_cast<double>(m0) * r.curve.at(m0) / r.curve.at(m);
    timing.calibrated = scaled(base->times, m0 == m ? 1.0 : factor);
    c.times = m0 == m ? "calibrated" : str("calibrated at ", m0, ", scaled");
  } else {
    flop_scale = 1.0 / r.curve.at(m);
    c.times = "FLOPs / curve";
  }
  PipelinePlacement placed;
  try {
    placed = plan_candidate(r, timing);
  } catch (const Error& e) {
    c.why_not = e.what();
    return c;
  }
  c.fits = true;
  auto units = flux_timed_units(r.config, *r.tree, timing);
  for (auto& u : units) u.ms *= flop_scale;
  const auto stages = ring_stages(map_json(placed.device_map), r.config, static_cast<int>(r.max_memory.gpu_indices().back()) + 1);
  const auto bytes = flux_ring_message_bytes(r.config, timing.height, timing.width, timing.text_tokens, r.dtype);
  RingSimulationInput in;
  for (const auto& s : stages) in.stage_ranks.push_back(s.rank);
  in.stage_ms = flux_ring_stage_ms(units, stages);
  in.prompt_bytes_per_image = bytes.prompts;
  in.step_input_bytes_per_image = bytes.step_inputs;
  in.activation_bytes_per_image = bytes.activations;
  in.noise_bytes_per_image = bytes.noise;
  in.link = r.link;
  in.images = r.images;
  in.microbatch_size = m;
  in.steps = r.steps;
  in.euler_ms = r.euler_ms;
  const auto sim = simulate_ring(in);
  c.images_per_s = sim.images_per_s;
  c.max_stage_ms = *std::max_element(in.stage_ms.begin(), in.stage_ms.end());
  return c;
}

}  // namespace

MicrobatchChoice choose_microbatch(const MicrobatchRequest& r) {
  DP_CHECK(r.tree != nullptr, "choose_microbatch needs the transformer's module tree");
  DP_CHECK(r.images >= 1, "choosing a microbatch size needs at least one image, got ", r.images);
  DP_CHECK(r.max_microbatch >= 1, "the largest microbatch size must be at least 1");
  DP_CHECK(!r.max_memory.gpu_indices().empty(), "choosing a microbatch size needs at least one GPU budget");
  std::set<int64_t> sizes;
  const int64_t bound = std::min(r.images, r.max_microbatch);
  for (int64_t m = 1; m <= bound; m *= 2) sizes.insert(m);
  sizes.insert(bound);
  MicrobatchChoice choice;
  const MicrobatchCandidate* best = nullptr;
  for (int64_t m : sizes) choice.candidates.push_back(simulate_candidate(r, m));
  for (const auto& c : choice.candidates)
    if (c.fits && (best == nullptr || c.images_per_s > best->images_per_s * 1.01)) best = &c;
  DP_CHECK(best != nullptr, "no microbatch size fits the memory caps: ", choice.candidates.front().why_not);
  choice.size = best->size;
  std::string others;
  for (const auto& c : choice.candidates) {
    if (&c == best) continue;
    others += str(others.empty() ? "" : ", ", c.size, ": ");
    others += c.fits ? str(std::round(c.images_per_s * 1000) / 1000, " images/s") : std::string("does not fit the memory caps");
  }
  choice.reason = str("microbatch size ", best->size, " chosen: ", std::round(best->images_per_s * 1000) / 1000,
                      " images/s simulated for ", r.images, " image(s) on ", r.max_memory.gpu_indices().size(),
                      " stage(s) (", others.empty() ? std::string("the only candidate") : others,
                      "; a smaller size within 1% wins), block times ", best->times, ", efficiency curve from ",
                      r.curve.source);
  return choice;
}

}  // namespace dp::placement
