// plan's checks of its options and the request they make (cli/plan_request.h).
#include "cli/plan_request.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/hub_cache.h"
#include "io/run_dtype.h"
#include "placement/calibration.h"
#include "placement/flux_module_tree.h"
#include "placement/mesh.h"
#include "placement/mesh_simulation.h"
#include "placement/microbatch_choice.h"
#include "placement/ring_simulator.h"

namespace dp::cli {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void parse_resolution(const std::string& text, int64_t* height, int64_t* width) {
  const auto x = text.find('x');
  DP_CHECK(x != std::string::npos && x > 0 && x + 1 < text.size(), "--block-times-at '", text,
           "' must be HEIGHTxWIDTH, as in 1024x1024");
  try {
    *height = std::stoll(text.substr(0, x));
    *width = std::stoll(text.substr(x + 1));
  } catch (const std::exception&) {
    DP_FAIL("--block-times-at '", text, "' must be HEIGHTxWIDTH, as in 1024x1024");
  }
}

std::vector<double> parse_stage_ms(const std::string& text) {
  std::vector<double> out;
  for (const auto& part : split_commas(text)) {
    double ms = -1;
    size_t used = 0;
    try {
      ms = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DP_CHECK(used == part.size() && std::isfinite(ms) && ms >= 0, "--stage-ms '", text, "': '", part,
             "' is not a non-negative number of milliseconds");
    out.push_back(ms);
  }
  DP_CHECK(!out.empty(), "--stage-ms '", text, "' gives no stage time; give one per ring stage, as in 41.5,40.9");
  return out;
}

// --sequence-parallel K, checked before anything else: K must divide the world (--world-size N, or S x K with S
// inferred from --max-memory) and suit the model (its heads, the tokens of the request); mesh.h words the refusal.
// The plan is then made for the S stage groups, one rank's figures each.
void apply_sequence_parallel(PlanOptions& o) {
  auto& r = o.request;
  const int k = o.simulation.sequence_parallel;
  DP_CHECK(k >= 1, "--sequence-parallel must be at least 1, got ", k);
  int world = 0;
  if (r.world_size) {
    world = *r.world_size;
    DP_CHECK(world >= 1 && world <= placement::kMaxWorldSize, "--world-size must be positive and at most ",
             placement::kMaxWorldSize, ", got ", world);
    r.world_size = placement::mesh_for_world(world, k).stages;
  } else {
    int groups = 1;
    if (!o.max_memory.empty()) {
      const auto gpus = placement::read_max_memory_argument(o.max_memory).gpu_indices();
      if (!gpus.empty()) groups = gpus.back() + 1;
    }
    world = groups * k;
  }
  const auto config = placement::read_transformer_config(r.model_dir);
  placement::check_sequence_parallel(
      k, placement::flux_sequence_parallel_limits(config, r.timing.height, r.timing.width, r.timing.text_tokens), world);
  r.timing.sequence_parallel = k;
}

// The microbatch size with the most simulated images/s for --prompts x --images-per-prompt on the world, under the
// memory caps, from the calibration's times and curve when there is one (placement/microbatch_choice.h).
nlohmann::ordered_json choose_plan_microbatch(const PlanOptions& o) {
  const auto& r = o.request;
  placement::MicrobatchRequest m;
  m.config = placement::read_transformer_config(r.model_dir);
  const auto tree = placement::flux_module_tree(m.config, r.dtype);
  m.tree = &tree;
  const auto fp8_tree = placement::flux_module_tree(m.config, r.dtype, placement::BlockWeights::fp8_gemms);
  if (r.fp8_gemms) m.fp8_tree = &fp8_tree;
  const int world = r.world_size ? *r.world_size : 0;
  if (r.max_memory) {
    m.max_memory = *r.max_memory;
  } else {
    for (int g = 0; g < std::max(world, 1); ++g) m.max_memory.set(placement::Device::gpu(g), r.gpu_memory_bytes);
  }
  m.timing = r.timing;
  m.dtype = r.dtype;
  m.cuda_caps = r.cuda_caps;
  m.images = o.simulation.prompts * o.simulation.images_per_prompt;
  m.steps = o.simulation.steps;
  m.euler_ms = o.simulation.euler_ms;
  m.link = placement::link_preset(o.simulation.link);
  if (!std::isnan(o.simulation.link_gbps)) m.link.gb_per_s = o.simulation.link_gbps;
  if (!std::isnan(o.simulation.link_latency_us)) m.link.latency_us = o.simulation.link_latency_us;
  m.key = {o.calibration_device, io::run_dtype_name(r.dtype), r.timing.height, r.timing.width, r.timing.text_tokens, 0};
  const auto choice_of_file = placement::choose_calibration(o.calibration, {m.key.device, m.key.dtype, m.key.height,
                                                                            m.key.width, m.key.text_tokens, 1});
  for (const auto& e : choice_of_file.entries) {
    if (!m.key.device.empty() && e.key.device != m.key.device) continue;
    m.calibrations.push_back(e);
  }
  // Entries of several devices for this shape: only with --calibration-device (find_calibration's rule).
  std::set<std::string> devices;
  for (const auto& e : m.calibrations)
    if (e.key.dtype == m.key.dtype && e.key.height == m.key.height && e.key.width == m.key.width &&
        e.key.text_tokens == m.key.text_tokens)
      devices.insert(e.key.device);
  if (devices.size() > 1) m.calibrations.clear();
  else if (devices.size() == 1) m.key.device = *devices.begin();
  m.curve = placement::efficiency_curve(m.calibrations, m.key);
  const auto choice = placement::choose_microbatch(m);
  nlohmann::ordered_json out = {{"chosen", choice.size}, {"reason", choice.reason}, {"curve_source", m.curve.source},
                                {"candidates", nlohmann::ordered_json::array()}};
  for (const auto& c : choice.candidates)
    out["candidates"].push_back({{"microbatch", c.size}, {"fits", c.fits}, {"images_per_s", c.images_per_s},
                                 {"max_stage_ms", c.max_stage_ms}, {"times", c.times}, {"why_not", c.why_not}});
  return out;
}

}  // namespace

PlanTimes prepare_plan_request(PlanOptions& o) {
  auto& r = o.request;
  r.model_dir = io::resolve_model_argument(r.model_dir, o.revision);
  if (o.sequence_parallel_given) apply_sequence_parallel(o);
  DP_CHECK(o.device == "cuda" || o.device == "cpu", "--device: expected cuda or cpu, got '", o.device, "'");
  // generate's rule (cli/torch_boundary.h): bf16 on cuda, fp32 on cpu, unless --dtype is given.
  const std::string dtype = o.dtype.empty() ? (o.device == "cuda" ? "bf16" : "fp32") : o.dtype;
  r.dtype = io::parse_run_dtype(dtype);
  if (!o.max_memory.empty()) r.max_memory = placement::read_max_memory_argument(o.max_memory);
  r.pipeline_components = split_commas(o.components);
  r.gpu_memory_bytes = placement::parse_memory_size(o.gpu_memory, "--gpu-memory");
  r.cpu_memory_bytes = placement::parse_memory_size(o.cpu_memory, "--cpu-memory");
  if (!o.block_times.empty()) {
    const auto parts = split_commas(o.block_times);
    DP_CHECK(parts.size() == 2, "--block-times '", o.block_times, "' must be DOUBLE_MS,SINGLE_MS, as in 3.07,2.85");
    try {
      r.timing.double_block_ms = std::stod(parts[0]);
      r.timing.single_block_ms = std::stod(parts[1]);
    } catch (const std::exception&) {
      DP_FAIL("--block-times '", o.block_times, "' must be two numbers of milliseconds, as in 3.07,2.85");
    }
    parse_resolution(o.block_times_at, &r.timing.measured_height, &r.timing.measured_width);
  }
  if (o.microbatch_given) {
    DP_CHECK(o.microbatch_size >= 1, "--microbatch-size must be at least 1, got ", o.microbatch_size);
    r.timing.batch = o.microbatch_size;  // generate plans at its microbatch size too
  }
  if (o.simulate || o.sweep) {  // before the microbatch choice below, which simulates them
    DP_CHECK(!o.prompts_given || o.simulation.prompts >= 1, "--prompts must be at least 1, got ", o.simulation.prompts);
    DP_CHECK(o.simulation.images_per_prompt >= 1, "--images-per-prompt must be at least 1, got ",
             o.simulation.images_per_prompt);
  }
  // --simulate --prompts P without a microbatch size: the size that maximises simulated images/s is chosen and
  // the plan made at it (placement/microbatch_choice.h).
  nlohmann::ordered_json microbatch_choice;
  if (o.simulate && o.prompts_given && !o.microbatch_given && !o.batch_given && !o.no_calibration &&
      r.device_map == "pipeline" && o.simulation.sequence_parallel == 1 && o.stage_ms.empty()) {
    microbatch_choice = choose_plan_microbatch(o);
    r.timing.batch = microbatch_choice["chosen"].get<int64_t>();
  }
  nlohmann::ordered_json calibration = {{"used", false}};
  if (o.no_calibration) {
    DP_CHECK(o.calibration.empty(), "--calibration and --no-calibration contradict each other");
    calibration["message"] = "planned from FLOP-scaled block times (--no-calibration)";
  } else {
    const placement::CalibrationKey key{o.calibration_device, io::run_dtype_name(r.dtype), r.timing.height,
                                        r.timing.width, r.timing.text_tokens, r.timing.batch};
    const auto choice = placement::choose_calibration(o.calibration, key);
    if (choice.entry) {
      r.timing.calibrated = choice.entry->times;
      r.timing.calibration_source = choice.source;
      calibration = {{"used", true}, {"file", choice.path}, {"device", choice.entry->key.device}};
    }
    calibration["message"] = choice.message;
  }
  auto& sim = o.simulation;
  if (o.simulate || o.sweep) {
    DP_CHECK(!o.prompts_given || sim.prompts >= 1, "--prompts must be at least 1, got ", sim.prompts);
    if (!o.prompts_given) sim.prompts = 0;
    DP_CHECK(sim.images_per_prompt >= 1, "--images-per-prompt must be at least 1, got ", sim.images_per_prompt);
    DP_CHECK(!(o.sweep && !o.stage_ms.empty()), "--stage-ms replaces the stage times of one map; --simulate-sweep "
             "plans a new split for every N, so the two do not go together");
    DP_CHECK(sim.gpus_per_node >= 1, "--gpus-per-node must be at least 1, got ", sim.gpus_per_node);
    placement::link_preset(sim.link);  // a wrong name fails before the headers are read
    if (!o.stage_ms.empty()) sim.stage_ms = parse_stage_ms(o.stage_ms);
  }
  return {calibration, microbatch_choice};
}

}  // namespace dp::cli
