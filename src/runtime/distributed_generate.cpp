#include "runtime/distributed_generate.h"

#include <c10/core/InferenceMode.h>
#include <torch/headeronly/version.h>

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "core/memory_stats.h"
#include "io/run_dtype.h"
#include "io/torch_tensors.h"
#include "io/weight_index.h"
#include "models/flux/flux_config.h"
#include "pipeline/denoise_loop.h"
#include "pipeline/finite_check.h"
#include "pipeline/device_stats.h"
#include "pipeline/flux_stage.h"
#include "pipeline/phase_guard.h"
#include "pipeline/stage_timer.h"
#include "placement/plan.h"
#include "placement/ring_stages.h"
#include "placement/component_placement.h"
#include "runtime/components.h"
#include "runtime/microbatch_decoder.h"
#include "runtime/mpi_transport.h"
#ifdef DIFFPIPE_HAVE_NCCL
#include "runtime/nccl_transport.h"
#endif
#include "runtime/ring.h"
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

// The split every rank computes from the same headers.
struct Plan {
  nlohmann::ordered_json hf_device_map;
  std::vector<placement::RankStage> stages;
  std::string digest;
};

Plan plan_transformer(const pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                      const pipeline::LatentGrid& grid, const RuntimeOptions& options, int world_size) {
  placement::PlanRequest plan_request;
  plan_request.model_dir = flux.folder().dir();
  plan_request.device_map = options.device_map.empty() ? "pipeline" : options.device_map;
  if (!options.max_memory.empty()) plan_request.max_memory = placement::read_max_memory_argument(options.max_memory);
  plan_request.world_size = world_size;
  plan_request.dtype = io::to_safetensors_dtype(request.dtype);
  // On CUDA the caps are enforced, so accelerate's strategies must leave room beside the weights (plan --cuda-caps).
  plan_request.cuda_caps = request.device.is_cuda() && !options.max_memory.empty();
  // The size the run computes (rounded as diffusers rounds it), in FLUX.1's 16-pixel units for the timing model.
  plan_request.timing.height = grid.height / 2 * 16;
  plan_request.timing.width = grid.width / 2 * 16;
  plan_request.timing.batch = options.microbatch_size;
  plan_request.timing.text_tokens = request.max_sequence_length;
  const auto plan = placement::make_plan(plan_request);
  const std::string config_path = flux.folder().component("transformer").path + "/config.json";
  const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
  Plan out;
  out.hf_device_map = plan.at("hf_device_map");
  out.stages = placement::ring_stages(out.hf_device_map, config, world_size);
  Fnv fnv;
  fnv.add(out.hf_device_map.dump());
  for (const auto& s : out.stages) fnv.add(placement::describe_stage(s));
  out.digest = plan_request.device_map + " " + fnv.hex();
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
             ", max_memory ", options.max_memory);
}

std::string describe_stages(const std::vector<placement::RankStage>& stages) {
  std::string text;
  for (const auto& s : stages) text += str(text.empty() ? "" : ", ", placement::describe_stage(s));
  return text;
}

std::string rank_report_path(const std::string& path, const World& world) {
  if (world.size() == 1) return path;
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + ".rank" + std::to_string(world.rank()) + p.extension().string())).string();
}

// --report: what this rank did in the denoising phase, per step, with its boundaries' traffic.
void write_rank_report(const RuntimeOptions& options, const World& world, const RingLayout& layout,
                       const at::Device& device, const RankTimes& times, double load_seconds, uint64_t load_bytes,
                       const std::string& transport_name, const Transport* transport,
                       const models::OffloadStats& offload) {
  if (options.report_path.empty()) return;
  const placement::RankStage* stage = layout.stage_of(world.rank());
  nlohmann::ordered_json doc = {
      {"rank", world.rank()},
      {"world_size", world.size()},
      {"host", world.host()},
      {"local_rank", world.local_rank()},
      {"device", device.str()},
      {"transport", transport_name},
      // Which clock the seconds below are on: CUDA events (device time) or the host's.
      {"compute_clock", device.is_cuda() ? "device" : "host"},
      {"transfer_clock", transport && transport->times_transfers_on_device() ? "device" : "host"},
      {"role", world.is_coordinator() ? (stage ? "coordinator and stage" : "coordinator") : (stage ? "stage" : "idle")},
      {"blocks", stage ? nlohmann::ordered_json::array({stage->first_block, stage->last_block}) : nlohmann::ordered_json()},
      {"load_seconds", load_seconds},
      {"load_bytes", load_bytes},
      {"load_gb_per_s", load_seconds > 0 ? load_bytes / 1e9 / load_seconds : 0.0},
      {"peak_resident_bytes", peak_resident_bytes()},
      {"peak_device_bytes", device.is_cuda() ? pipeline::peak_memory_bytes(device) : 0},
      {"peak_device_reserved_bytes", pipeline::peak_reserved_bytes(device)},
      {"receives_from", world.is_coordinator() ? layout.last_rank() : layout.previous(world.rank())},
      {"sends_to", world.is_coordinator() ? (layout.coordinator_runs_first_stage() ? layout.next(0) : layout.first_rank())
                                          : layout.next(world.rank())},
      {"bytes_sent", transport ? transport->bytes_sent() : 0},
      {"bytes_received", transport ? transport->bytes_received() : 0},
      {"denoise_wall_seconds", times.wall_seconds},
      {"compute_seconds", times.compute_seconds},
      {"receive_seconds", times.wait_seconds},
      {"send_seconds", times.send_seconds},
      {"host_wait_seconds", times.host_wait_seconds},
      {"idle_seconds", std::max(0.0, times.wall_seconds - times.compute_seconds - times.wait_seconds - times.send_seconds)},
      {"microbatch_steps", times.steps},
      // Offloaded blocks this rank streamed to its GPU (all zero when it holds none, or on CPU).
      {"offloaded_blocks", offload.blocks},
      {"offload_copies", offload.copies},
      {"offload_bytes", offload.bytes},
      {"offload_copy_seconds", offload.copy_seconds},
      {"offload_pinned_host_bytes", offload.host_bytes}};
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (size_t s = 0; s < times.per_step.size(); ++s) {
    const auto& step = times.per_step[s];
    steps.push_back({{"step", s + 1}, {"microbatches", step.microbatches}, {"compute_seconds", step.compute_seconds},
                     {"receive_seconds", step.receive_seconds}, {"send_seconds", step.send_seconds}});
  }
  doc["per_step"] = steps;
  const std::string path = rank_report_path(options.report_path, world);
  write_json_file(path, doc);
  DP_INFO("rank ", world.rank(), ": wrote ", path);
}

// --max-memory holds at run time too: this rank's CUDA caching allocator may not grow past its GPU's entry, so
// two ranks capped at 16 GB on one H200 behave like the seed's two 16 GB cards. An allocation past the cap fails
// with LibTorch's out-of-memory error, which names the cap; run_guarded adds the rank.
void cap_device_memory(const RuntimeOptions& options, const World& world, const at::Device& device) {
  if (options.max_memory.empty() || !device.is_cuda()) return;
  const auto caps = placement::read_max_memory_argument(options.max_memory);
  const auto gpu = placement::Device::gpu(world.rank());
  if (!caps.has(gpu)) return;
#ifdef DIFFPIPE_HAVE_CUDA
  // The allocator sizes its per-device tables on first use; the cap must come after that.
  at::globalContext().lazyInitDevice(at::kCUDA);
  const auto total = static_cast<double>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
  const double fraction = std::min(1.0, static_cast<double>(caps.at(gpu)) / total);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
  DP_INFO("rank ", world.rank(), ": CUDA allocator capped at ", caps.at(gpu) / 1e9, " GB (", std::fixed,
          std::setprecision(3), fraction, " of ", total / 1e9, " GB)");
#else
  DP_FAIL("this build has no CUDA support");
#endif
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

std::string choose_transport(const std::string& requested, bool cuda_device, int world_size) {
  DP_CHECK(requested == "auto" || requested == "nccl" || requested == "mpi", "--transport: expected auto, nccl or mpi, got '",
           requested, "'");
  if (requested == "mpi") return "mpi";
  if (requested == "auto") return cuda_device && built_with_nccl() && world_size > 1 ? "nccl" : "mpi";
  DP_CHECK(cuda_device, "--transport nccl moves tensors between GPUs and needs --device cuda; with --device cpu use "
           "--transport mpi (or auto)");
  DP_CHECK(built_with_nccl(), "--transport nccl: this diffpipe was built without NCCL (configure with nccl.h and "
           "libnccl found, or -DDIFFPIPE_NCCL_ROOT=DIR); use --transport mpi (or auto)");
  return "nccl";
}

bool built_with_nccl() {
#ifdef DIFFPIPE_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

namespace {

// "NCCL 2.30.7" (with the library's path when `with_path`), or that this build has none.
std::string nccl_version_text(bool with_path) {
#ifdef DIFFPIPE_HAVE_NCCL
  const std::string text = nccl_loaded_version();
  return with_path ? text : text.substr(0, text.find(" ("));
#else
  (void)with_path;
  return "no NCCL in this build";
#endif
}

std::unique_ptr<Transport> make_transport(const std::string& name, const RingLayout& layout, const World& world,
                                          const at::Device& device, const RuntimeOptions& options) {
  if (name == "mpi") return std::make_unique<MpiTransport>(world.rank(), world.size(), options.transport_timeout_seconds);
#ifdef DIFFPIPE_HAVE_NCCL
  // The boundaries that carry tensors: coordinator -> first stage (unless rank 0 runs it), stage -> stage, last
  // stage -> coordinator. Ranks off the ring only hear a shutdown, which is control alone (MPI).
  std::vector<NcclLink> links;
  const auto& stages = layout.stages();
  if (!layout.coordinator_runs_first_stage()) links.push_back({0, stages.front().rank});
  for (size_t i = 1; i < stages.size(); ++i) links.push_back({stages[i - 1].rank, stages[i].rank});
  if (stages.back().rank != 0) links.push_back({stages.back().rank, 0});
  return std::make_unique<NcclTransport>(world.rank(), world.size(), options.transport_timeout_seconds, device, links);
#else
  DP_FAIL("rank ", world.rank(), ": transport ", name, " is not in this build");
#endif
}

// The offloaded blocks of a stage as the model takes them: "cpu" blocks wait in pinned host memory, "disk"
// blocks in the mmapped safetensors file (accelerate's two offload tiers).
std::map<int64_t, models::OffloadedWeights> offloaded_weights(const placement::RankStage& stage) {
  std::map<int64_t, models::OffloadedWeights> out;
  for (const auto& o : stage.offloaded)
    out[o.block] = o.tier == placement::OffloadTier::cpu ? models::OffloadedWeights::pinned_host
                                                         : models::OffloadedWeights::mapped_file;
  return out;
}

void log_offload(const World& world, const pipeline::FluxStage* stage) {
  if (stage == nullptr) return;
  const auto stats = stage->offload_stats();
  if (stats.copies == 0) return;
  DP_INFO("rank ", world.rank(), ": ", stats.blocks, " offloaded block(s) streamed in ", stats.copies, " copies, ",
          std::fixed, std::setprecision(1), stats.bytes / 1e6, " MB, ", std::setprecision(3), stats.copy_seconds,
          " s of copy time on the side stream (", std::setprecision(1), stats.host_bytes / 1e6, " MB pinned on the host)");
}

// The component messages' codes in Message::step, so that a chunk of CLIP's output is never taken for T5's.
constexpr int32_t kClipCode = 0;
constexpr int32_t kT5Code = 1;

// An encoder rank other than 0: its output to the coordinator, kEncodeChunk prompts a message.
void send_embeddings(Transport& transport, const at::Tensor& rows, int32_t component_code) {
  const int64_t count = rows.size(0);
  for (int64_t first = 0, chunk = 0; first < count; first += pipeline::FluxPipeline::kEncodeChunk, ++chunk) {
    const int64_t n = std::min(pipeline::FluxPipeline::kEncodeChunk, count - first);
    transport.send(0, {MessageKind::embeddings, chunk, component_code, {rows.narrow(0, first, n)}});
  }
}

// On the coordinator: an encoder rank's output, every chunk's header checked against what was asked for.
at::Tensor receive_embeddings(Transport& transport, const ComponentPlace& place, int32_t component_code,
                              std::vector<int64_t> row_shape, const pipeline::GenerateRequest& request) {
  const auto prompts = static_cast<int64_t>(request.encode_texts().size());  // with true CFG, negatives too
  std::vector<at::Tensor> parts;
  for (int64_t first = 0, chunk = 0; first < prompts; first += pipeline::FluxPipeline::kEncodeChunk, ++chunk) {
    const int64_t n = std::min(pipeline::FluxPipeline::kEncodeChunk, prompts - first);
    Message message = transport.receive(place.rank);
    std::vector<int64_t> shape = {n};
    shape.insert(shape.end(), row_shape.begin(), row_shape.end());
    const bool ok = message.kind == MessageKind::embeddings && message.step == component_code &&
                    message.microbatch == chunk && message.tensors.size() == 1 && message.tensors[0].defined() &&
                    message.tensors[0].sizes().vec() == shape && message.tensors[0].scalar_type() == request.dtype;
    DP_CHECK(ok, "rank 0: expected chunk ", chunk, " of ", place.name, "'s output from rank ", place.rank, " (",
             at::IntArrayRef(shape), " ", request.dtype, "), got a ", message_kind_name(message.kind), " message (chunk ",
             message.microbatch, ", code ", message.step, ", ", message.tensors.size(), " tensor(s)",
             message.tensors.empty() || !message.tensors[0].defined()
                 ? std::string()
                 : str(", ", message.tensors[0].sizes(), " ", message.tensors[0].scalar_type()),
             ")");
    // Kept on the host, as the other ranks' embeddings are; over NCCL a chunk arrives on this rank's GPU.
    parts.push_back(message.tensors[0].to(at::kCPU));
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, 0);
}

// Rows of microbatch `id`: the loop cuts the batch into microbatch_size rows, the last one smaller.
int64_t microbatch_rows(int64_t id, int64_t batch, int64_t microbatch_size) {
  return std::min(microbatch_size, batch - id * microbatch_size);
}

GenerateOutcome run_ranks(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                          const pipeline::LatentGrid& grid, const RuntimeOptions& options, const Outputs& outputs,
                          World& world, std::unique_ptr<Transport>& transport) {
  c10::InferenceMode guard;
  const std::string transport_name = choose_transport(options.transport, request.device.is_cuda(), world.size());
  if (world.is_coordinator())
    DP_INFO("runtime: ", world.size(), " rank(s); ", world.uses_mpi() ? world.mpi_version() : "no MPI launcher",
            "; ", nccl_version_text(true), "; LibTorch ", TORCH_VERSION, "; build ", build_id(), "; transport ",
            transport_name);
  const bool decode = static_cast<bool>(outputs.on_images);
  world.agree("diffpipe build", build_id(), options.transport_timeout_seconds);
  world.agree("transport (--transport, device, NCCL in the build)", transport_name, options.transport_timeout_seconds);
  // One process holds one libnccl: the ranks must have loaded the same one (a node whose LibTorch's copy won
  // would speak another NCCL).
  if (transport_name == "nccl")
    world.agree("NCCL version (the library loaded)", nccl_version_text(false), options.transport_timeout_seconds);
  world.agree("request (prompts, size, steps, seed, guidance, dtype, microbatch size, output, component map)",
              request_digest(request, options) + request.extras_digest() + (decode ? ", png" : ", latent"),
              options.transport_timeout_seconds);
  const std::string transformer_dir = flux.folder().component("transformer").path;
  const std::string fingerprint = model_fingerprint(transformer_dir) + adapters_fingerprint(request);
  world.agree("model fingerprint (transformer config and tensor headers, LoRA adapters)", fingerprint,
              options.transport_timeout_seconds);
  const auto& checkpoints = options.checkpoints;
  world.agree("checkpoint to resume from", checkpoints.resume ? checkpoints.resume_path : "(none)",
              options.transport_timeout_seconds);
  // Before anything loads: a component map naming a rank past the world is refused here, on every rank.
  const ComponentPlan components = plan_components(flux.folder(), options.pipeline_device_map, options.max_memory,
                                                   request.dtype, world.size());
  const Plan plan = plan_transformer(flux, request, grid, options, world.size());
  world.agree("plan (device map and block ranges)", plan.digest, options.transport_timeout_seconds);
  const RingLayout layout(plan.stages, world.size());
  if (world.is_coordinator()) {
    DP_INFO("runtime: ring ", describe_stages(plan.stages), "; hf_device_map ", plan.hf_device_map.dump());
    const char* source = components.from_map ? " (--pipeline-device-map balanced)" : " (the coordinator)";
    DP_INFO("phase encode: hf_device_map ", components.encode_map().dump(), source);
    DP_INFO("phase denoise: hf_device_map ", plan.hf_device_map.dump());
    if (decode) DP_INFO("phase decode: hf_device_map ", components.decode_map().dump(), source);
  }

  const at::Device device = rank_device(request.device, world);
  cap_device_memory(options, world, device);
  if (world.uses_mpi()) transport = make_transport(transport_name, layout, world, device, options);
  const placement::RankStage* mine = layout.stage_of(world.rank());
  double load_seconds = 0;
  uint64_t load_bytes = 0;
  const auto load_stage = [&]() -> std::shared_ptr<pipeline::FluxStage> {
    if (mine == nullptr) return nullptr;
    const auto started = std::chrono::steady_clock::now();
    const std::string phase = str("loading blocks [", mine->first_block, ", ", mine->last_block, ")");
    auto stage = pipeline::run_phase(world.rank(), phase, [&] {
      return std::make_shared<pipeline::FluxStage>(transformer_dir, mine->first_block, mine->last_block, request.dtype,
                                                   device, grid, request.max_sequence_length, offloaded_weights(*mine),
                                                   request.lora);
    });
    load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    load_bytes = stage->weight_bytes();
    DP_INFO("rank ", world.rank(), ": loaded blocks [", mine->first_block, ", ", mine->last_block, "): ", std::fixed,
            std::setprecision(1), load_bytes / 1e6, " MB in ", std::setprecision(2), load_seconds, " s (",
            std::setprecision(3), load_seconds > 0 ? load_bytes / 1e9 / load_seconds : 0.0, " GB/s)");
    return stage;
  };

  const int64_t batch = request.batch();
  const int64_t microbatches = (batch + options.microbatch_size - 1) / options.microbatch_size;
  const ComponentPlace& vae_place = components.vae;
  const bool decodes_here = decode && world.rank() == vae_place.rank;
  // The VAE's budget on its rank: its --max-memory entry (the GPU that is this rank, or cpu), else free memory.
  const auto decode_budget = [&](uint64_t stage_bytes) {
    DecodeBudget budget;
    budget.stage_bytes = stage_bytes;
    budget.vae_bytes = vae_place.bytes;
    if (budget.vae_bytes == 0) {
      const auto& vae = flux.folder().component("vae");
      budget.vae_bytes = placement::component_bytes(vae, flux.folder().config("vae"), io::to_safetensors_dtype(request.dtype));
    }
    if (!options.max_memory.empty()) {
      const auto caps = placement::read_max_memory_argument(options.max_memory);
      // GPU d is rank d, on a CPU run too (the plan budgets ranks the same way); "cpu" for a VAE the map puts there.
      const auto key = vae_place.on_cpu ? placement::Device::cpu() : placement::Device::gpu(world.rank());
      if (caps.has(key)) budget.cap_bytes = caps.at(key);
    }
    return budget;
  };

  // The encode phase on this rank: the encoders the map gives it, each loaded, run and freed in turn. A resume
  // runs no encoder, and the embeddings cache lives with the coordinator: then rank 0 takes the whole phase
  // (every rank reads the same flags, so all know).
  const bool encoders_on_their_ranks = !checkpoints.resume && checkpoints.embeddings_cache.empty();
  if (world.is_coordinator() && !encoders_on_their_ranks && components.from_map)
    DP_INFO("phase encode: on rank 0 (", checkpoints.resume ? "--resume" : "--embeddings-cache",
            "), not where --pipeline-device-map puts the text encoders");
  at::Tensor pooled, t5_rows;
  if (encoders_on_their_ranks) {
    std::optional<pipeline::StageTimer> timer;
    if (world.is_coordinator() || world.rank() == components.clip.rank || world.rank() == components.t5.rank)
      timer.emplace("encode", device, flux.report_sink());
    if (world.rank() == components.clip.rank) {
      pooled = flux.encode_clip_pooled(request, components.clip.device(device), *timer);
      if (!world.is_coordinator()) send_embeddings(*transport, pooled, kClipCode);
    }
    if (world.rank() == components.t5.rank) {
      t5_rows = flux.encode_t5(request, components.t5.device(device), *timer);
      if (!world.is_coordinator()) send_embeddings(*transport, t5_rows, kT5Code);
    }
    if (world.is_coordinator()) {
      const std::string config_path = transformer_dir + "/config.json";
      const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
      if (components.clip.rank != 0)
        pooled = receive_embeddings(*transport, components.clip, kClipCode, {config.pooled_projection_dim}, request);
      if (components.t5.rank != 0)
        t5_rows = receive_embeddings(*transport, components.t5, kT5Code,
                                     {request.max_sequence_length, config.joint_attention_dim}, request);
    }
  }

  if (!world.is_coordinator()) {
    pooled = t5_rows = at::Tensor();  // sent; the coordinator keeps them
    auto stage = load_stage();  // while rank 0 finishes encoding
    std::optional<MicrobatchDecoder> decoder;
    std::function<void(Message&)> on_decode;
    if (decodes_here) {
      decoder.emplace(flux, request, grid, options.microbatch_size, vae_place.device(device), world.rank(),
                      [&](int64_t microbatch, const at::Tensor& images) {
                        transport->send(0, {MessageKind::images, microbatch, -1, {images}});
                      });
      decoder->prepare(decode_budget(load_bytes));
      std::vector<bool> seen(static_cast<size_t>(microbatches), false);
      on_decode = [&, seen](Message& message) mutable {
        const int64_t id = message.microbatch;
        const bool known = id >= 0 && id < microbatches && !seen[static_cast<size_t>(id)];
        DP_CHECK(message.kind == MessageKind::decode && known && message.tensors.size() == 1 &&
                     message.tensors[0].defined() && message.tensors[0].dim() == 3 &&
                     message.tensors[0].size(0) == microbatch_rows(id, batch, options.microbatch_size),
                 "rank ", world.rank(), ": malformed decode message from rank ", message.source, " (",
                 message_kind_name(message.kind), ", microbatch ", id, known ? "" : " unknown or repeated", ", ",
                 message.tensors.size(), " tensor(s))");
        seen[static_cast<size_t>(id)] = true;
        decoder->accept(id, message.tensors[0]);
      };
    }
    const RankTimes times = pipeline::run_phase(world.rank(), str("denoising (blocks [", mine ? mine->first_block : 0, ", ",
                                                                 mine ? mine->last_block : 0, "))"),
                                                [&] { return run_stage_worker(world.rank(), layout, *transport, stage.get(), device,
                                                                              options.transport_timeout_seconds, on_decode); });
    log_offload(world, stage.get());
    const models::OffloadStats offload = stage ? stage->offload_stats() : models::OffloadStats{};
    stage.reset();  // the blocks are freed before a VAE that did not fit next to them loads
    if (decoder) {
      // Decode messages the coordinator sent before the ring's shutdown reached this rank by another path.
      while (decoder->accepted() < microbatches) {
        Message message = transport->receive(0);
        on_decode(message);
      }
      decoder->finish();
      transport->flush();
      DP_INFO("rank ", world.rank(), ": decoded ", microbatches, " microbatch(es) in ", std::fixed, std::setprecision(2),
              decoder->decode_seconds(), " s (VAE load ", decoder->load_seconds(), " s)");
    }
    DP_INFO("rank ", world.rank(), ": ", times.steps, " microbatch steps, ", std::fixed, std::setprecision(2),
            times.compute_seconds, " s computing, ", times.wait_seconds, " s waiting; ",
            transport->bytes_sent() / 1e6, " MB sent, ", transport->bytes_received() / 1e6, " MB received");
    write_rank_report(options, world, layout, device, times, load_seconds, load_bytes, transport_name, transport.get(),
                      offload);
    GenerateOutcome outcome;
    outcome.stopped = world.share_from_coordinator(0, options.transport_timeout_seconds) != 0;
    return outcome;
  }

  // The coordinator: embeddings on the host, one row per image (from the encoder ranks, the embeddings cache or
  // the checkpoint resumed); the initial noise of the whole batch.
  pipeline::PromptEmbeddings prompts;
  at::Tensor latents;
  if (checkpoints.resume) {
    const auto& c = *checkpoints.resume;
    prompts = embeddings_from_checkpoint(c, request.device);
    latents = from_raw(c.latents, request.device);
    DP_INFO("resume: ", checkpoints.resume_path, ": ", c.steps_done(), "/", c.run.steps,
            " steps done (slowest image); prompt embeddings from the checkpoint, no text encoder runs");
  } else if (!encoders_on_their_ranks) {
    prompts = encode_prompts_cached(flux, request, checkpoints.embeddings_cache);
    latents = flux.initial_latents(request, grid);
  } else {
    prompts = pipeline::FluxPipeline::expand_per_image(request, std::move(pooled), std::move(t5_rows));
    latents = flux.initial_latents(request, grid);
  }
  // The text encoders' cached segments would otherwise be split by the blocks' weights and count against the cap.
  pipeline::release_cached_memory(device);
  std::vector<bool> images_in(static_cast<size_t>(microbatches), false);
  int64_t microbatches_written = 0;
  const auto write_images = [&](int64_t microbatch, const at::Tensor& images, int rank) {
    outputs.on_images(microbatch * options.microbatch_size, images, rank);
    images_in[static_cast<size_t>(microbatch)] = true;
    ++microbatches_written;
  };
  // Images from the decoding rank, their header checked before anything is written.
  const auto take_images = [&](Message& message) {
    const int64_t id = message.microbatch;
    const bool known = id >= 0 && id < microbatches && !images_in[static_cast<size_t>(id)];
    const at::Tensor* images = message.tensors.size() == 1 ? &message.tensors[0] : nullptr;
    const bool shaped = images != nullptr && images->defined() && images->scalar_type() == at::kByte &&
                        images->dim() == 4 && images->size(0) == (known ? microbatch_rows(id, batch, options.microbatch_size) : -1) &&
                        images->size(1) == request.height && images->size(2) == request.width && images->size(3) == 3;
    DP_CHECK(message.kind == MessageKind::images && message.source == vae_place.rank && known && shaped,
             "rank 0: expected the images of a finished microbatch from rank ", vae_place.rank, ", got a ",
             message_kind_name(message.kind), " message from rank ", message.source, " (microbatch ", id,
             known ? "" : ", unknown or already written", images && images->defined() ? str(", ", images->sizes()) : "",
             ")");
    // The writers read host memory; over NCCL the images arrive on this rank's GPU (the decoding rank may be
    // the ring's last stage, whose link to rank 0 is an NCCL one).
    write_images(id, images->to(at::kCPU), vae_place.rank);
  };
  std::optional<MicrobatchDecoder> local_decoder;
  at::Tensor final_latents;
  RankTimes ring_times;
  models::OffloadStats coordinator_offload;
  GenerateOutcome outcome;
  {
    pipeline::StageTimer timer("denoise", device, flux.report_sink());
    auto stage = timer.loading("transformer load", load_stage);
    if (decodes_here) {
      local_decoder.emplace(flux, request, grid, options.microbatch_size, vae_place.device(device), 0,
                            [&](int64_t microbatch, const at::Tensor& images) { write_images(microbatch, images, 0); });
      local_decoder->prepare(decode_budget(load_bytes));
    }
    const pipeline::DenoiseSchedule schedule = flux.schedule(request, latents.size(1));
    RingExecutor executor(layout, transport.get(), stage, device, options.transport_timeout_seconds);
    if (decode && vae_place.rank != 0) executor.listen_to(vae_place.rank, take_images);
    pipeline::DenoiseJob job = pipeline::make_denoise_job(request, prompts, latents, schedule, options.microbatch_size);
    // Checkpoints hold every image's latents, finished ones too (a resume decodes those again).
    job.keep_final_latents = !decode || !checkpoints.dir.empty();
    if (checkpoints.resume) {
      const auto& c = *checkpoints.resume;
      // Same options and model give the same schedule; a difference means another scheduler config.
      DP_CHECK(c.sigmas == schedule.scheduler.sigmas() && c.timesteps == schedule.scheduler.timesteps(),
               checkpoints.resume_path, ": the checkpoint's sigma/timestep schedule differs from the one this run "
               "computes (another scheduler config or diffpipe version?)");
      DP_CHECK(c.latents.shape == latents.sizes().vec(), checkpoints.resume_path, ": latents of shape ",
               latents.sizes(), " expected for this model and size");
      job.start_steps = c.image_steps;
    }
    io::Checkpoint base;
    if (!checkpoints.dir.empty()) {
      base.run = checkpoint_run(request, options.microbatch_size);
      base.model_dir = fs::absolute(flux.folder().dir()).string();
      base.model_fingerprint = fingerprint;
      base.device_map = plan.digest + " " + plan.hf_device_map.dump();
      base.world_size = world.size();
      base.written_by = build_id();
      base.sigmas = schedule.scheduler.sigmas();
      base.timesteps = schedule.scheduler.timesteps();
      // Written with every checkpoint, copied to the CPU once.
      record_embeddings(base, prompts);
    }
    Checkpointer checkpointer(checkpoints, std::move(base));
    pipeline::LoopCallbacks callbacks;
    if (!checkpoints.dir.empty())
      callbacks.at_boundary = [&checkpointer](const pipeline::LoopState& state) { return checkpointer.at_boundary(state); };
    // NaN weights or an overflow give an all-black image with exit 0 unless a step is checked: one reduction each.
    const int steps = schedule.scheduler.num_inference_steps();
    const bool several_microbatches = latents.size(0) > options.microbatch_size;
    callbacks.check_step = [steps, several_microbatches](int64_t microbatch, int step, const at::Tensor& stepped) {
      pipeline::check_step_latents(stepped, {step + 1, steps, several_microbatches ? str("microbatch ", microbatch) : ""});
    };
    if (decode) {
      callbacks.on_microbatch_done = [&](int64_t first_row, const at::Tensor& done) {
        const int64_t id = first_row / options.microbatch_size;
        DP_INFO("microbatch ", id, " finished (images ", first_row, " to ", first_row + done.size(0) - 1,
                "): to rank ", vae_place.rank, " to decode");
        if (local_decoder) local_decoder->accept(id, done);
        else transport->send(vae_place.rank, {MessageKind::decode, id, -1, {done}});
      };
    }
    if (outputs.on_step) {
      callbacks.on_step = [&](const pipeline::LoopProgress& p) {
        // The step's latents come from the compute stream: waiting for that stream alone keeps the progress
        // line honest without waiting for transfers in flight on the transport's streams (a device-wide sync
        // would also wait for receives pre-posted for later steps).
#ifdef DIFFPIPE_HAVE_CUDA
        if (device.is_cuda()) at::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
        outputs.on_step(p);
      };
    }
    const auto began = std::chrono::steady_clock::now();
    final_latents = pipeline::run_phase(0, "denoising", [&] { return pipeline::run_denoise_loop(job, executor, callbacks); });
    log_offload(world, stage.get());
    checkpointer.finish();  // the last checkpoint on disk (or its failure) before the ranks stop
    executor.shutdown();
    outcome.stopped = checkpointer.stopped();
    outcome.checkpoint = checkpointer.last_path();
    world.share_from_coordinator(outcome.stopped ? 1 : 0, options.transport_timeout_seconds);
    ring_times = executor.times();
    ring_times.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    coordinator_offload = stage ? stage->offload_stats() : models::OffloadStats{};
    if (transport)
      DP_INFO("rank 0: ", executor.times().steps, " microbatch steps computed, ", std::fixed, std::setprecision(2),
              executor.times().wait_seconds, " s waiting for results; ", transport->bytes_sent() / 1e6, " MB sent, ",
              transport->bytes_received() / 1e6, " MB received");
  }  // the coordinator's blocks are released before a VAE that did not fit next to them loads
  pipeline::release_cached_memory(device);
  if (outcome.stopped || !decode) {
    write_rank_report(options, world, layout, device, ring_times, load_seconds, load_bytes, transport_name,
                      transport.get(), coordinator_offload);
    // Stopped: the checkpoint holds the state, and the images of microbatches finished before it are written.
    if (!outcome.stopped && outputs.on_latents) outputs.on_latents(final_latents);
    return outcome;
  }
  if (outputs.on_latents) outputs.on_latents(final_latents);
  // The decode stage's report. With the VAE resident its work interleaves with denoising (and is inside the
  // denoise stage's wall time too): the report books the VAE's load and decode seconds. When another rank
  // decodes, it books what rank 0 spends waiting for the last images after denoising.
  const auto decode_started = std::chrono::steady_clock::now();
  if (local_decoder) {
    local_decoder->finish();
  } else {
    while (microbatches_written < microbatches) {
      Message message = transport->receive(vae_place.rank);
      take_images(message);
    }
  }
  pipeline::StageReport report;
  report.name = "decode";
  report.load_seconds = local_decoder ? local_decoder->load_seconds() : 0.0;
  report.seconds = local_decoder ? local_decoder->load_seconds() + local_decoder->decode_seconds()
                                 : pipeline::seconds_since(decode_started);
  report.peak_resident_bytes = peak_resident_bytes();
  report.peak_device_bytes = device.is_cuda() ? pipeline::peak_memory_bytes(device) : 0;
  DP_INFO("stage decode: ", microbatches, " microbatch(es) decoded on rank ", vae_place.rank, "; ", std::fixed,
          std::setprecision(3), report.seconds, " s", local_decoder ? str(" (VAE load ", report.load_seconds, " s)")
                                                                    : std::string(" waiting for the last images"));
  flux.report_sink()->push_back(report);
  // After the decode, so that the peak memory it reports covers a decode left for the end.
  write_rank_report(options, world, layout, device, ring_times, load_seconds, load_bytes, transport_name,
                      transport.get(), coordinator_offload);
  DP_CHECK(microbatches_written == microbatches, "rank 0: ", microbatches_written, " of ", microbatches,
           " microbatches' images were written");
  return outcome;
}

}  // namespace

std::string build_id() {
  return str("diffpipe ", DIFFPIPE_VERSION, " git ", DIFFPIPE_GIT_REVISION, " built ", __DATE__, " ", __TIME__);
}

std::string adapters_fingerprint(const pipeline::GenerateRequest& request) {
  return request.lora ? " + LoRA " + request.lora->fingerprint() : std::string();
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

GenerateOutcome distributed_generate(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                                     const pipeline::LatentGrid& grid, const RuntimeOptions& options,
                                     const Outputs& outputs) {
  std::unique_ptr<Transport> transport;
  return run_ranks(flux, request, grid, options, outputs, World::get(), transport);
}

}  // namespace dp::runtime
