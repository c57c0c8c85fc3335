// `diffpipe plan`: where every module would go, from configs and safetensors headers only (no GPU, no
// weights read): hf_device_map as diffusers/accelerate would compute it, per-device bytes, the ranks each
// map needs, and predicted stage times of the map next to "balanced" and diffpipe's time-balanced
// "pipeline". With --simulate, the denoising ring of each map replayed on paper (placement/ring_simulator.h);
// with --simulate-sweep, the "pipeline" split on 1 to 64 GPUs and every mesh of stage groups x sequence-parallel
// ranks of the world (cli/plan_simulation.h).
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>

#include "cli/command.h"
#include "cli/format.h"
#include "cli/plan_simulation.h"
#include "core/error.h"
#include "io/hub_cache.h"
#include "io/run_dtype.h"
#include "placement/calibration.h"
#include "placement/mesh.h"
#include "placement/mesh_simulation.h"
#include "placement/microbatch_choice.h"
#include "placement/flux_module_tree.h"
#include "placement/plan.h"
#include "placement/ring_simulator.h"

namespace dp::cli {
namespace {

struct PlanOptions {
  placement::PlanRequest request;
  std::string max_memory;
  std::string components;
  std::string device = "cuda";  // plan places GPUs, usually from a machine without one: cuda unless told
  std::string dtype;            // empty: as generate picks it, bf16 on cuda and fp32 on cpu
  std::string block_times;
  std::string block_times_at = "1024x1024";
  std::string gpu_memory = "141GB";
  std::string cpu_memory = "128GB";
  int world_size = 0;  // read only when --world-size was given
  bool as_json = false;
  // --simulate and --simulate-sweep
  bool simulate = false;
  bool sweep = false;
  SimulationOptions simulation;
  bool prompts_given = false;
  int64_t microbatch_size = 0;  // when not given: --batch
  bool microbatch_given = false;
  bool batch_given = false;
  std::string stage_ms;
  bool sequence_parallel_given = false;
  // Measured block times (placement/calibration.h): --calibration FILE, else the default file when it exists.
  std::string calibration;
  std::string calibration_device;
  bool no_calibration = false;
  std::string revision;  // of a --model given as a Hugging Face id
};

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

std::string device_text(const nlohmann::ordered_json& value) {
  return value.is_number() ? std::to_string(value.get<int>()) : value.get<std::string>();
}

// Groups runs such as transformer_blocks.0 .. transformer_blocks.16 on one device into one line.
void print_map(const nlohmann::ordered_json& map) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& item : map.items()) entries.emplace_back(item.key(), device_text(item.value()));
  auto split_index = [](const std::string& key, std::string* stem, long* index) {
    const auto dot = key.rfind('.');
    if (dot == std::string::npos || dot + 1 == key.size()) return false;
    const std::string tail = key.substr(dot + 1);
    if (tail.find_first_not_of("0123456789") != std::string::npos) return false;
    *stem = key.substr(0, dot);
    *index = std::stol(tail);
    return true;
  };
  for (std::size_t i = 0; i < entries.size();) {
    std::string stem, next_stem;
    long first = 0, last = 0, next = 0;
    std::size_t j = i + 1;
    if (split_index(entries[i].first, &stem, &first)) {
      last = first;
      while (j < entries.size() && entries[j].second == entries[i].second &&
             split_index(entries[j].first, &next_stem, &next) && next_stem == stem && next == last + 1) {
        last = next;
        ++j;
      }
    }
    const std::string key = entries[i].first.empty() ? "\"\" (everything)"
                            : j > i + 1 ? stem + "." + std::to_string(first) + "-" + std::to_string(last)
                                        : entries[i].first;
    std::cout << "  " << std::left << std::setw(40) << key << " " << entries[i].second << "\n";
    i = j;
  }
}

std::string bytes_or_dash(const nlohmann::ordered_json& value) {
  return value.is_null() ? "unlimited" : human_bytes(static_cast<uint64_t>(std::max<int64_t>(value.get<int64_t>(), 0)));
}

// With a mesh, map_ranks' ranks are stage groups: group d holds GPU d's blocks on ranks d x K ... d x K + K - 1.
void print_ranks(const nlohmann::ordered_json& ranks, const nlohmann::ordered_json& mesh) {
  const int count = ranks["ranks"].get<int>();
  if (mesh.is_null()) {
    std::cout << "ranks: " << count << " (GPU d of the map is rank d; launch with mpirun -np " << count << ")\n";
  } else {
    const int k = mesh["sequence_parallel"].get<int>();
    std::cout << "ranks: " << count * k << " = " << count << " stage group(s) x " << k
              << " (GPU d of the map is stage group d, ranks d x " << k << " ... d x " << k << " + " << k - 1
              << "; launch with mpirun -np " << count * k << " and --sequence-parallel " << k << ")\n";
  }
  if (ranks.contains("unsupported")) {
    std::cout << "  the multi-rank runtime cannot run this map: " << ranks["unsupported"].get<std::string>() << "\n";
    return;
  }
  if (mesh.is_null()) {
    std::cout << "  ring: " << ring_text(ranks) << "; rank 0 "
              << (ranks["ring"][0]["rank"].get<int>() == 0 ? "also coordinates" : "coordinates only") << "\n";
    return;
  }
  const int k = mesh["sequence_parallel"].get<int>();
  std::cout << "  ring:" << (ranks["ring"][0]["rank"].get<int>() == 0 ? "" : " rank 0 ->");
  for (const auto& s : ranks["ring"]) {
    const int group = s["rank"].get<int>();
    std::cout << " group " << group << " (ranks " << group * k << "-" << group * k + k - 1 << ") blocks ["
              << s["first_block"].get<int64_t>() << ", " << s["last_block"].get<int64_t>() << ") ->";
  }
  std::cout << " rank 0; rank 0 is shard 0 of group 0; rank (g, k) sends its token shard to rank (g + 1, k)\n";
}

// Milliseconds with two decimals, or as many as show three significant digits of a small figure: a tiny model's
// 0.0412 ms is not "0.00".
std::string ms_text(double ms) {
  int decimals = 2;
  if (ms > 0 && ms < 1) decimals = std::min(6, 2 - static_cast<int>(std::floor(std::log10(ms))));
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", decimals, ms);
  return text;
}

// `ranks`: what map_ranks says of the same map.
void print_timing_row(const nlohmann::ordered_json& t, const nlohmann::ordered_json& ranks) {
  char line[256];
  std::snprintf(line, sizeof(line), "  %-16s %9s %9s %11.3f %11.1f%% %6d%s ", t["strategy"].get<std::string>().c_str(),
                ms_text(t["max_stage_ms"].get<double>()).c_str(), ms_text(t["mean_stage_ms"].get<double>()).c_str(),
                t["imbalance"].get<double>(), 100.0 * t["pipeline_efficiency"].get<double>(), ranks["ranks"].get<int>(),
                ranks.contains("unsupported") ? "*" : " ");
  std::cout << line;
  for (const auto& s : t["stages"]) {
    const double ms = s["ms"].get<double>();
    std::snprintf(line, sizeof(line), " %s:%s", device_text(s["device"]).c_str(),
                  ms >= 1 ? str(std::fixed, std::setprecision(1), ms).c_str() : ms_text(ms).c_str());
    std::cout << line;
  }
  std::cout << "\n";
}

void print_plan(const nlohmann::ordered_json& plan) {
  std::cout << "model: " << plan["model"].get<std::string>() << "  (dtype " << plan["dtype"].get<std::string>()
            << (plan.contains("dtype_from") ? ", " + plan["dtype_from"].get<std::string>() : std::string())
            << ", world of " << plan["world_size"].get<int>() << " GPU(s))\n";
  if (plan.contains("mesh")) {
    const auto& mesh = plan["mesh"];
    std::cout << "mesh: " << mesh["world_size"].get<int>() << " ranks = " << mesh["stages"].get<int>()
              << " pipeline stage group(s) x " << mesh["sequence_parallel"].get<int>()
              << " sequence-parallel ranks; below, GPU d is stage group d (each of its ranks holds its blocks) and "
                 "stage times and activations are one rank's, on its token shard\n";
  }
  std::cout << "max_memory (" << plan["max_memory_from"].get<std::string>() << "):";
  for (const auto& item : plan["max_memory"].items())
    std::cout << " " << item.key() << "=" << human_bytes(item.value().get<uint64_t>());
  std::cout << "\n\ntransformer '" << plan["transformer"]["component"].get<std::string>() << "' ("
            << human_bytes(plan["transformer"]["total_bytes"].get<uint64_t>()) << ") with --device-map "
            << plan["transformer"]["device_map"].get<std::string>() << "\nhf_device_map:\n";
  print_map(plan["hf_device_map"]);
  const nlohmann::ordered_json no_mesh;
  print_ranks(plan["ranks"], plan.contains("mesh") ? plan["mesh"] : no_mesh);

  std::cout << "\ndevices:\n  " << std::left << std::setw(8) << "device" << std::setw(6) << "rank" << std::right
            << std::setw(12) << "weights" << std::setw(12) << "reserved" << std::setw(12) << "budget" << std::setw(12)
            << "free" << "\n";
  for (const auto& d : plan["devices"]) {
    std::cout << "  " << std::left << std::setw(8) << device_text(d["device"]) << std::setw(6)
              << (d["rank"].is_null() ? std::string("-") : std::to_string(d["rank"].get<int>())) << std::right
              << std::setw(12) << human_bytes(d["weights_bytes"].get<uint64_t>()) << std::setw(12)
              << human_bytes(d["reserved_bytes"].get<uint64_t>()) << std::setw(12) << bytes_or_dash(d["budget_bytes"])
              << std::setw(12) << bytes_or_dash(d["free_bytes"]) << (d["offloaded"].get<bool>() ? "  (offloaded)" : "")
              << "\n";
  }

  const auto& cmp = plan["comparison"];
  std::cout << "\npredicted stage times per denoising step at " << cmp["resolution"].get<std::string>() << " ("
            << cmp["timing_source"].get<std::string>() << "):\n"
            << "  strategy           max ms   mean ms   imbalance  efficiency  ranks   per GPU (ms)\n";
  print_timing_row(plan["stage_times"], plan["ranks"]);
  // The comparison rows, but not again the strategy asked for (its row is the first).
  const std::string asked = plan["stage_times"]["strategy"].get<std::string>();
  if (asked != "balanced") print_timing_row(cmp["balanced"], cmp["balanced"]["ranks"]);
  if (asked == "pipeline") {
  } else if (cmp["pipeline"].contains("infeasible")) {
    std::cout << "  pipeline         infeasible: " << cmp["pipeline"]["infeasible"].get<std::string>() << "\n";
  } else {
    print_timing_row(cmp["pipeline"], cmp["pipeline"]["ranks"]);
  }
  if (plan.contains("mesh"))
    std::cout << "  (ranks: the stage groups the map needs, of " << plan["mesh"]["sequence_parallel"].get<int>()
              << " ranks each; ms: one rank's; * the multi-rank runtime cannot run it)\n";
  else
    std::cout << "  (ranks: the world the map needs, mpirun -np that many; * the multi-rank runtime cannot run it)\n";

  if (plan.contains("pipeline_hf_device_map")) {
    std::cout << "\npipeline_hf_device_map (pipeline-level \"balanced\"):\n";
    for (const auto& c : plan["components"]) {
      std::cout << "  " << std::left << std::setw(20) << c["component"].get<std::string>() << std::right << std::setw(12)
                << human_bytes(c["bytes"].get<uint64_t>()) << "  " << device_text(c["device"])
                << (c["offloaded"].get<bool>() ? "  (offloaded)" : "") << "\n";
    }
  }
}

// --- Run ---

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

void run_plan(PlanOptions& o) {
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
  auto plan = placement::make_plan(r);
  plan["calibration"] = calibration;
  if (!microbatch_choice.is_null()) plan["microbatch_choice"] = microbatch_choice;
  if (o.dtype.empty()) plan["dtype_from"] = str("the default for --device ", o.device);
  const int world = plan["world_size"].get<int>() * sim.sequence_parallel;
  if (sim.sequence_parallel > 1)
    plan["mesh"] = {{"world_size", world}, {"stages", plan["world_size"]}, {"sequence_parallel", sim.sequence_parallel},
                    {"rank", "stage x sequence_parallel + shard"}};

  // The ranks each map needs (GPU d is rank d) and the ring the runtime would build from it.
  const auto config = models::FluxConfig::from_json(nlohmann::json::parse(plan["transformer"]["config"].dump()),
                                                    "the transformer's config.json");
  plan["ranks"] = placement::to_json(placement::map_ranks(plan["hf_device_map"], config));
  for (const char* name : {"balanced", "pipeline"}) {
    auto& cmp = plan["comparison"][name];
    if (cmp.contains("hf_device_map")) cmp["ranks"] = placement::to_json(placement::map_ranks(cmp["hf_device_map"], config));
  }
  if (o.simulate || o.sweep) {
    plan["simulation"] = simulate_plan(r, sim, config, plan);
    if (o.sweep) {
      plan["simulation_sweep"] = simulate_sweep(r, sim, config, world);
      plan["mesh_sweep"] = simulate_mesh_sweep(r, sim, config, world);
    }
  }
  if (o.as_json) {
    std::cout << plan.dump(2) << "\n";
    return;
  }
  std::cout << "times: " << plan["calibration"]["message"].get<std::string>() << "\n";
  if (plan.contains("microbatch_choice")) std::cout << "microbatch: " << plan["microbatch_choice"]["reason"].get<std::string>() << "\n";
  print_plan(plan);
  if (plan.contains("simulation")) print_simulation(plan["simulation"]);
  if (plan.contains("simulation_sweep")) print_sweep(plan["simulation_sweep"]);
  if (plan.contains("mesh_sweep")) print_mesh_sweep(plan["mesh_sweep"]);
}

CommandRegistrar registrar("plan", 40, [](CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "plan",
      "Show where every module would go: hf_device_map exactly as diffusers/accelerate compute it, per-device\n"
      "bytes and ranks, and predicted stage times next to \"balanced\" and the time-balanced \"pipeline\".\n"
      "Reads config.json files and safetensors headers only: no GPU, no weights.");
  auto o = std::make_shared<PlanOptions>();
  o->request.device_map = "pipeline";  // generate's default: plan shows what a plain generate would run
  cmd->add_option("--model", o->request.model_dir,
                  "diffusers model folder (or the transformer folder), or a Hugging Face model id in the local cache")
      ->required();
  cmd->add_option("--revision", o->revision, "with a model id: branch, tag or commit of the cached snapshot (main)");
  cmd->add_option("--device-map", o->request.device_map,
                  "transformer placement: auto, balanced, balanced_low_0, sequential (accelerate's), pipeline\n"
                  "(diffpipe's contiguous stages balanced by time; generate's default too), or FILE.json with a\n"
                  "custom map such as {\"transformer_blocks\": 0, \"single_transformer_blocks\": 1}")
      ->capture_default_str();
  cmd->add_option("--pipeline-device-map", o->request.pipeline_device_map,
                  "place whole components too; only \"balanced\" (as diffusers' pipeline-level device_map)");
  cmd->add_option("--components", o->components,
                  "components for --pipeline-device-map, comma-separated (default: every component with weights,\n"
                  "the transformer included, as FluxPipeline.from_pretrained(device_map=\"balanced\"); the guide's\n"
                  "encoders-only step, transformer=None and vae=None, is text_encoder,text_encoder_2)");
  cmd->add_option("--max-memory", o->max_memory,
                  "per-device budgets: 0=16GB,1=16GB,cpu=64GB or FILE.json ({\"0\": \"16GB\"}). GB/MB/KB are powers\n"
                  "of 1000, GiB/MiB/KiB of 1024, plain integers are bytes. Devices left out get nothing.\n"
                  "Default: every GPU of the world at --gpu-memory, plus cpu at --cpu-memory");
  auto* world_size = cmd->add_option(
      "--world-size", o->world_size,
      str("number of GPUs (ranks), 1 to ", placement::kMaxWorldSize,
          "; left out, one past the highest GPU --max-memory names (1 without --max-memory)"));
  cmd->add_option("--height", o->request.timing.height, "image height for activation and time estimates")->capture_default_str();
  cmd->add_option("--width", o->request.timing.width, "image width")->capture_default_str();
  auto* batch = cmd->add_option("--batch", o->request.timing.batch, "images per micro-batch")->capture_default_str();
  cmd->add_option("--dtype,--torch-dtype", o->dtype,
                  "run dtype: bf16, fp16 or fp32 (default as generate picks it: bf16 on cuda, fp32 on cpu)");
  cmd->add_option("--device", o->device,
                  "the device generate will run on, for the default --dtype: cuda (default: plan places GPUs, often\n"
                  "from a machine without one) or cpu")
      ->capture_default_str();
  cmd->add_option("--block-times", o->block_times,
                  "measured ms per double,single block (H200 bf16 at 1024x1024: 3.07,2.85); default: FLOPs only");
  cmd->add_option("--block-times-at", o->block_times_at, "resolution the block times were measured at")->capture_default_str();
  cmd->add_option("--calibration", o->calibration,
                  "block times written by `diffpipe calibrate`: used when an entry matches the dtype, --height,\n"
                  "--width, --text-tokens and --microbatch-size (default: " + placement::default_calibration_path() +
                      " when it exists)");
  cmd->add_option("--calibration-device", o->calibration_device,
                  "the device whose calibration to plan from (a GPU name as calibrate wrote it; needed when the\n"
                  "file has entries of several devices for this run)");
  cmd->add_flag("--no-calibration", o->no_calibration, "plan from FLOP-scaled times even when a calibration matches");
  cmd->add_option("--text-tokens", o->request.timing.text_tokens, "text tokens (T5 max_sequence_length)")
      ->capture_default_str();
  cmd->add_option("--tflops", o->request.timing.sustained_tflops, "sustained TFLOP/s for the FLOP-only estimate")
      ->capture_default_str();
  cmd->add_flag("--cuda-caps", o->request.cuda_caps,
                "plan as `generate --device cuda --max-memory` does, where max_memory also caps each rank's CUDA\n"
                "allocator: auto/balanced/sequential place weights in each GPU's max_memory less the activations,\n"
                "the allocator reserve and two streamed blocks (without it: exactly accelerate's map)");
  cmd->add_option("--gpu-memory", o->gpu_memory,
                  "assumed free memory per GPU without --max-memory, and each GPU's memory in --simulate-sweep")
      ->capture_default_str();
  cmd->add_option("--cpu-memory", o->cpu_memory, "assumed host memory without --max-memory")->capture_default_str();
  cmd->add_flag("--json", o->as_json,
                "print one JSON object (hf_device_map, pipeline_hf_device_map, devices, ranks, stage times, and\n"
                "the simulation when asked for)");
  // The simulator: placement/ring_simulator.h.
  cmd->add_flag("--simulate", o->simulate,
                "replay the denoising ring of this map, \"balanced\" and \"pipeline\" on paper: images/s, one-prompt\n"
                "latency, bubble (idle share of stage time), busy share per stage and bytes on every link");
  cmd->add_flag("--simulate-sweep", o->sweep,
                "also simulate the \"pipeline\" split on N = 1, 2, 4 ... 64 GPUs (and --world-size) for 1, N and 4N\n"
                "prompts, and every mesh of S stage groups x K sequence-parallel ranks = the world: one image's\n"
                "latency and --prompts' throughput (default 4N), the best of each marked; each GPU at --gpu-memory");
  auto* sequence_parallel = cmd->add_option(
      "--sequence-parallel", o->simulation.sequence_parallel,
      "K: the world (--world-size) is S = N / K pipeline stage groups of K ranks that split each image's tokens\n"
      "(Ulysses all-to-alls around attention); maps and stage times are then per stage group and per rank");
  cmd->add_option("--gpus-per-node", o->simulation.gpus_per_node,
                  "GPUs per node: a sequence group across nodes sends its cross-node all-to-all share over ib")
      ->capture_default_str();
  cmd->add_option("--link", o->simulation.link, "link between ring neighbours:\n" + placement::link_presets_help())
      ->capture_default_str();
  cmd->add_option("--link-gbps", o->simulation.link_gbps, "link bandwidth in GB/s (one direction), replacing --link's");
  cmd->add_option("--link-latency-us", o->simulation.link_latency_us, "latency of one message in microseconds, replacing --link's");
  cmd->add_flag("--no-overlap", o->simulation.no_overlap,
                "a rank waits for its sends to finish before computing again (the runtime overlaps them)");
  auto* prompts = cmd->add_option("--prompts", o->simulation.prompts, "prompts to simulate (default: 1, N and 4N for a world of N)");
  cmd->add_option("--images-per-prompt,--num-images-per-prompt", o->simulation.images_per_prompt, "images per prompt")
      ->capture_default_str();
  auto* microbatch = cmd->add_option("--microbatch-size", o->microbatch_size,
                  "images per microbatch, as generate's option; also the --batch the plan is made for")
      ->excludes(batch);
  cmd->add_option("--steps", o->simulation.steps, "denoising steps")->capture_default_str();
  cmd->add_option("--euler-ms", o->simulation.euler_ms,
                  "rank 0's time per microbatch step for the Euler update and the loop (an estimate; --report measures it)")
      ->capture_default_str();
  cmd->add_option("--max-in-flight", o->simulation.max_in_flight,
                  "steps in flight at once (default: one per ring stage, as the runtime); more hides transfer time");
  cmd->add_option("--stage-ms", o->stage_ms,
                  "replace the planned compute time of each ring stage of this map (ms per microbatch step, in ring\n"
                  "order), e.g. measured ones from generate --report");
  cmd->callback([o, world_size, prompts, microbatch, sequence_parallel, batch] {
    if (world_size->count() > 0) o->request.world_size = o->world_size;
    o->sequence_parallel_given = sequence_parallel->count() > 0;
    o->prompts_given = prompts->count() > 0;
    o->microbatch_given = microbatch->count() > 0;
    o->batch_given = batch->count() > 0;
    run_plan(*o);
  });
});

}  // namespace
}  // namespace dp::cli
