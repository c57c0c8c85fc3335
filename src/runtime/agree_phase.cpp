#include "runtime/agree_phase.h"

#include <torch/headeronly/version.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <optional>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "io/run_dtype.h"
#include "io/torch_tensors.h"
#include "io/weight_index.h"
#include "models/flux/flux_config.h"
#include "pipeline/block_timing.h"
#include "pipeline/device_stats.h"
#include "placement/calibration.h"
#include "placement/mesh.h"
#include "placement/plan.h"
#include "runtime/transports.h"
#include "runtime/world.h"

#ifndef DIFFPIPE_GIT_REVISION
#define DIFFPIPE_GIT_REVISION "unknown"
#endif

namespace dp::runtime {
namespace {

namespace fs = std::filesystem;

// FNV-1a, 64 bit: a stable fingerprint, not a security measure.
struct Fnv {
  uint64_t hash = 0xcbf29ce484222325ULL;
  void add(const std::string& text) {
    for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ULL;
    hash = (hash ^ 0xff) * 0x100000001b3ULL;  // separator, so "ab"+"c" differs from "a"+"bc"
  }
  std::string hex() const {
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(hash));
    return out;
  }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DP_CHECK(in.good(), path, ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The device map over the mesh's stage groups (GPU d is group d).
TransformerPlan plan_transformer(const pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                                 const pipeline::LatentGrid& grid, const RuntimeOptions& options,
                                 const placement::MeshShape& shape, const at::Device& device,
                                 const std::optional<placement::CalibratedTimes>& measured_on_load = std::nullopt) {
  const int world_size = shape.stages;
  placement::PlanRequest plan_request;
  plan_request.model_dir = flux.folder().dir();
  plan_request.device_map = options.device_map.empty() ? "pipeline" : options.device_map;
  if (!options.max_memory.empty()) plan_request.max_memory = placement::read_max_memory_argument(options.max_memory);
  plan_request.world_size = world_size;
  plan_request.dtype = io::to_safetensors_dtype(request.dtype);
  // On CUDA the caps are enforced, so accelerate's strategies must leave room beside the weights (plan --cuda-caps).
  plan_request.cuda_caps = request.device.is_cuda() && !options.max_memory.empty();
  plan_request.fp8_gemms = options.fp8_gemms;  // the CLI folds DIFFPIPE_FP8_GEMMS=1 into it
  // The size the run computes (rounded as diffusers rounds it), in FLUX.1's 16-pixel units for the timing model.
  plan_request.timing.height = grid.height / 2 * 16;
  plan_request.timing.width = grid.width / 2 * 16;
  plan_request.timing.batch = options.microbatch_size;
  plan_request.timing.text_tokens = request.max_sequence_length;
  TransformerPlan out;
  if (plan_request.device_map == "pipeline" && measured_on_load) {
    plan_request.timing.calibrated = *measured_on_load;
    plan_request.timing.calibration_source = str("--calibrate-on-load (rank 0's ", pipeline::device_name(device), ")");
    out.times_from = "planned from block times measured on load: " + plan_request.timing.calibration_source;
  } else if (plan_request.device_map == "pipeline" && !options.no_calibration) {
    // Each rank looks up its own device; ranks that found different times plan different splits, which the plan
    // agreement then refuses naming both.
    const placement::CalibrationKey key{pipeline::device_name(device), io::run_dtype_name(plan_request.dtype),
                                        plan_request.timing.height, plan_request.timing.width,
                                        plan_request.timing.text_tokens, plan_request.timing.batch};
    const auto choice = placement::choose_calibration(options.calibration, key);
    if (choice.entry) {
      plan_request.timing.calibrated = choice.entry->times;
      plan_request.timing.calibration_source = choice.source;
    }
    out.times_from = choice.message;
  } else {
    out.times_from = plan_request.device_map == "pipeline"
                         ? "planned from FLOP-scaled block times (--no-calibration)"
                         : str("--device-map ", plan_request.device_map, " places by memory, not by time");
  }
  const auto plan = placement::make_plan(plan_request);
  const std::string config_path = flux.folder().component("transformer").path + "/config.json";
  const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
  out.hf_device_map = plan.at("hf_device_map");
  if (plan.contains("block_weights")) out.block_weights = plan["block_weights"].get<std::string>();
  try {
    out.stages = placement::ring_stages(out.hf_device_map, config, world_size);
  } catch (const Error& e) {
    if (shape.sequence_parallel == 1) throw;
    throw Error(str(e.what(), " (--sequence-parallel ", shape.sequence_parallel, ": the map plans the ", shape.stages,
                    " stage group(s), GPU d is group d)"), e.file(), e.line());
  }
  Fnv fnv;
  fnv.add(out.hf_device_map.dump());
  for (const auto& s : out.stages) fnv.add(placement::describe_stage(s));
  out.digest = plan_request.device_map + " " + fnv.hex() +
               (plan_request.timing.calibrated ? " calibrated " + plan_request.timing.calibration_source : std::string());
  if (shape.sequence_parallel > 1) out.digest += str(" mesh ", shape.stages, "x", shape.sequence_parallel);
  return out;
}

// What every rank must have been asked to do, in a readable form when short.
std::string request_digest(const pipeline::GenerateRequest& request, const RuntimeOptions& options) {
  Fnv prompts;
  for (const auto& p : request.prompts) prompts.add(p);
  return str(request.prompts.size(), " prompts (", prompts.hex(), ") x ", request.num_images_per_prompt, ", ",
             request.width, "x", request.height, ", ", request.steps, " steps, seed ", request.seed, ", guidance ",
             request.guidance, ", ", io::run_dtype_name(request.dtype), ", ", request.max_sequence_length,
             " tokens, microbatch ", options.microbatch_size, ", device ", request.device.type() == at::kCUDA ? "cuda" : "cpu",
             ", components ", options.pipeline_device_map.empty() ? "on the coordinator" : options.pipeline_device_map,
             ", max_memory ", options.max_memory, options.calibrate_on_load ? ", --calibrate-on-load" : "");
}

// The seconds --calibrate-on-load may take, loading the timed parts included.
constexpr double kCalibrateOnLoadSeconds = 2.0;

// --calibrate-on-load: before any rank loads its blocks, rank 0 times one block of each kind, the embedders and
// the output layers on its device at this run's shape and microbatch size (bounded), shares the four times, and
// every rank re-plans the "pipeline" split from them and agrees on it again. Rank 0 alone measures: the ranks'
// GPUs are one kind (their names would differ in the plan otherwise), and one measurement keeps every rank's
// plan identical by construction.
void calibrate_on_load(RunContext& run, const placement::MeshShape& shape, double timeout) {
  const World& world = run.world;
  const auto& options = run.options;
  const std::string device_map = options.device_map.empty() ? "pipeline" : options.device_map;
  if (device_map != "pipeline" || shape.sequence_parallel > 1) {
    if (world.is_coordinator())
      DP_INFO("--calibrate-on-load: not used (it re-plans the \"pipeline\" split of one rank per stage; this run has "
              "--device-map ", device_map, shape.sequence_parallel > 1 ? " and --sequence-parallel" : "", ")");
    return;
  }
  const at::Device device = rank_device(run.request.device, world);
  std::array<double, 4> ms = {0, 0, 0, 0};
  if (world.is_coordinator()) {
    const auto started = std::chrono::steady_clock::now();
    const std::string config_path = run.transformer_dir + "/config.json";
    pipeline::BlockTimingRequest timing;
    timing.weights = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(run.transformer_dir));
    timing.config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
    timing.dtype = run.request.dtype;
    timing.device = device;
    timing.grid = run.grid;
    timing.text_tokens = run.request.max_sequence_length;
    timing.microbatch = std::min<int64_t>(options.microbatch_size, run.batch());
    timing.warmup = 1;
    timing.repeat = 5;
    timing.max_seconds = kCalibrateOnLoadSeconds * 0.75;  // the rest for loading the timed parts and the re-plan
    const auto t = pipeline::time_flux_blocks(timing);
    pipeline::release_cached_memory(device);
    ms = {t.embedders_ms, t.double_block_ms, t.single_block_ms, t.output_ms};
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    DP_INFO("--calibrate-on-load: ", pipeline::device_name(device), ", microbatch ", timing.microbatch, ": double block ",
            t.double_block_ms, " ms, single block ", t.single_block_ms, " ms, embedders ", t.embedders_ms,
            " ms, output ", t.output_ms, " ms (median of ", t.runs, " run(s)); measured in ", seconds, " s (bound ",
            kCalibrateOnLoadSeconds, " s)");
  }
  // Shared in units of 0.1 us: an int holds up to 214 s per unit.
  placement::CalibratedTimes shared;
  double* fields[] = {&shared.embedders_ms, &shared.double_block_ms, &shared.single_block_ms, &shared.output_ms};
  for (size_t i = 0; i < ms.size(); ++i) {
    const int tenths_of_us = world.share_from_coordinator(
        static_cast<int>(std::min(std::max(ms[i], 0.0) * 1e4, 2.0e9)), timeout);
    *fields[i] = std::max(tenths_of_us, 1) / 1e4;  // a block of 0 ms would not plan; 0.1 us is "nothing"
  }
  run.plan = plan_transformer(run.flux, run.request, run.grid, options, shape, device, shared);
  world.agree("plan after --calibrate-on-load (device map and block ranges)", run.plan.digest, timeout);
}

}  // namespace

std::string build_id() {
  return str("diffpipe ", DIFFPIPE_VERSION, " git ", DIFFPIPE_GIT_REVISION, " built ", __DATE__, " ", __TIME__);
}

std::string model_fingerprint(const std::string& transformer_dir) {
  Fnv fnv;
  fnv.add(read_text((fs::path(transformer_dir) / "config.json").string()));
  const auto weights = io::WeightIndex::open_dir(transformer_dir);
  for (const auto& name : weights.names()) {
    const auto& info = weights.info(name);
    std::string shape;
    for (int64_t d : info.shape) shape += std::to_string(d) + ",";
    fnv.add(str(name, " ", io::dtype_name(info.dtype), " ", shape, " ", info.nbytes()));
  }
  return fnv.hex();
}

std::string adapters_fingerprint(const pipeline::GenerateRequest& request) {
  return request.lora ? " + LoRA " + request.lora->fingerprint() : std::string();
}

void agree_phase(RunContext& run) {
  const World& world = run.world;
  const auto& request = run.request;
  const auto& options = run.options;
  const double timeout = options.transport_timeout_seconds;
  run.transport_name = choose_transport(options.transport, request.device.is_cuda(), world.size());
  if (world.is_coordinator())
    DP_INFO("runtime: ", world.size(), " rank(s); ", world.uses_mpi() ? world.mpi_version() : "no MPI launcher",
            "; ", nccl_version_text(true), "; LibTorch ", TORCH_VERSION, "; build ", build_id(), "; transport ",
            run.transport_name);
  run.decode = static_cast<bool>(run.outputs.on_images);
  world.agree("diffpipe build", build_id(), timeout);
  world.agree("transport (--transport, device, NCCL in the build)", run.transport_name, timeout);
  // One process holds one libnccl: the ranks must have loaded the same one (a node whose LibTorch's copy won
  // would speak another NCCL).
  if (run.transport_name == "nccl") world.agree("NCCL version (the library loaded)", nccl_version_text(false), timeout);
  run.request_summary = request_digest(request, options) + request.extras_digest() + (run.decode ? ", png" : ", latent");
  world.agree("request (prompts, size, steps, seed, guidance, dtype, microbatch size, output, component map)",
              run.request_summary, timeout);
  run.run_id = world.share_text_from_coordinator(options.checkpoints.run_id, "run id", timeout);
  run.transformer_dir = run.flux.folder().component("transformer").path;
  run.fingerprint = model_fingerprint(run.transformer_dir) + adapters_fingerprint(request);
  world.agree("model fingerprint (transformer config and tensor headers, LoRA adapters)", run.fingerprint, timeout);
  const auto& checkpoints = options.checkpoints;
  world.agree("checkpoint to resume from", checkpoints.resume ? checkpoints.resume_path : "(none)", timeout);
  // The mesh: S stage groups x K ranks. The device map and the components' map plan the S groups.
  const std::string config_path = run.transformer_dir + "/config.json";
  const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
  const placement::MeshShape shape = placement::check_mesh(
      world.size(), options.sequence_parallel,
      {config.num_attention_heads, request.max_sequence_length, run.grid.tokens()});
  world.agree("mesh (stage groups x sequence-parallel ranks)", str(shape.stages, " x ", shape.sequence_parallel), timeout);
  // Before anything loads: a component map naming a rank past the world is refused here, on every rank.
  run.components = plan_components(run.flux.folder(), options.pipeline_device_map, options.max_memory, request.dtype,
                                   world.size(), shape.sequence_parallel);
  run.plan = plan_transformer(run.flux, request, run.grid, options, shape, rank_device(request.device, world));
  world.agree("plan (device map and block ranges)", run.plan.digest, timeout);
  if (options.calibrate_on_load) calibrate_on_load(run, shape, timeout);
  run.mesh.emplace(run.plan.stages, shape, request.max_sequence_length, run.grid.tokens());
  if (world.is_coordinator()) {
    const std::string mesh = shape.sequence_parallel == 1 ? std::string()
        : str("; mesh ", shape.stages, " stage group(s) x ", shape.sequence_parallel, " sequence-parallel ranks (",
              request.max_sequence_length, " text and ", run.grid.tokens(), " image tokens split over each group)");
    DP_INFO("runtime: split ", run.plan.times_from);
    if (!run.plan.block_weights.empty()) DP_INFO("runtime: blocks planned at ", run.plan.block_weights);
    DP_INFO("runtime: ring ", run.layout().describe(), mesh, "; hf_device_map ", run.plan.hf_device_map.dump());
    const char* source = run.components.from_map ? " (--pipeline-device-map balanced)" : " (the coordinator)";
    DP_INFO("phase encode: hf_device_map ", run.components.encode_map().dump(), source);
    DP_INFO("phase denoise: hf_device_map ", run.plan.hf_device_map.dump());
    if (run.decode) DP_INFO("phase decode: hf_device_map ", run.components.decode_map().dump(), source);
  }
}

}  // namespace dp::runtime
