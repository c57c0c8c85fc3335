#include "runtime/encode_phase.h"

#include <optional>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "models/flux/flux_config.h"
#include "pipeline/stage_timer.h"
#include "runtime/checkpointing.h"
#include "runtime/load_phase.h"
#include "runtime/world.h"

namespace dp::runtime {
namespace {

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

}  // namespace

EncodedPrompts encode_phase(RunContext& run) {
  const World& world = run.world;
  const auto& components = run.components;
  const auto& checkpoints = run.checkpoints();
  if (world.is_coordinator() && !run.encoders_on_their_ranks() && components.from_map)
    DP_INFO("phase encode: on rank 0 (", checkpoints.resume ? "--resume" : "--embeddings-cache",
            "), not where --pipeline-device-map puts the text encoders");
  EncodedPrompts encoded;
  if (!run.encoders_on_their_ranks()) {
    encoder_weights_loaded(run);  // the coordinator's cached or resumed embeddings: nothing here to wait for
    return encoded;
  }
  std::optional<pipeline::StageTimer> timer;
  if (world.is_coordinator() || world.rank() == components.clip.rank || world.rank() == components.t5.rank)
    timer.emplace("encode", run.device, run.flux.report_sink());
  // Both encoders on this rank's one device: T5's weights may load during CLIP's forward (encode_both).
  const bool both_here = world.rank() == components.clip.rank && world.rank() == components.t5.rank;
  if (both_here && components.clip.device(run.device) == components.t5.device(run.device)) {
    auto texts = run.flux.encode_both(run.request, components.clip.device(run.device), *timer,
                                      [&run] { encoder_weights_loaded(run); });
    encoded.pooled = std::move(texts.pooled);
    encoded.t5_rows = std::move(texts.t5);
  } else {
    encoder_weights_loaded(run);  // the gate is for one device's encoders; with them apart, no waiting
    if (world.rank() == components.clip.rank)
      encoded.pooled = run.flux.encode_clip_pooled(run.request, components.clip.device(run.device), *timer);
    if (world.rank() == components.t5.rank)
      encoded.t5_rows = run.flux.encode_t5(run.request, components.t5.device(run.device), *timer);
  }
  // The embeddings of encoders off rank 0 are the transport's first messages: every rank connects it here.
  if (components.clip.rank != 0 || components.t5.rank != 0) run.connect_transport();
  if (!world.is_coordinator()) {
    if (world.rank() == components.clip.rank) send_embeddings(*run.transport, encoded.pooled, kClipCode);
    if (world.rank() == components.t5.rank) send_embeddings(*run.transport, encoded.t5_rows, kT5Code);
  }
  if (world.is_coordinator()) {
    const std::string config_path = run.transformer_dir + "/config.json";
    const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
    if (components.clip.rank != 0)
      encoded.pooled = receive_embeddings(*run.transport, components.clip, kClipCode, {config.pooled_projection_dim},
                                          run.request);
    if (components.t5.rank != 0)
      encoded.t5_rows = receive_embeddings(*run.transport, components.t5, kT5Code,
                                           {run.request.max_sequence_length, config.joint_attention_dim}, run.request);
  } else {
    encoded = EncodedPrompts{};  // sent; the coordinator keeps them
  }
  return encoded;
}

CoordinatorStart coordinator_start(RunContext& run, EncodedPrompts encoded) {
  const auto& request = run.request;
  const auto& checkpoints = run.checkpoints();
  CoordinatorStart start;
  if (checkpoints.resume) {
    const auto& c = *checkpoints.resume;
    start.prompts = embeddings_from_checkpoint(c, request.device);
    start.latents = from_raw(c.latents, request.device);
    DP_INFO("resume: ", checkpoints.resume_path, ": ", c.steps_done(), "/", c.run.steps,
            " steps done (slowest image); prompt embeddings from the checkpoint, no text encoder runs");
  } else if (!run.encoders_on_their_ranks()) {
    start.prompts = encode_prompts_cached(run.flux, request, checkpoints.embeddings_cache);
    start.latents = run.flux.initial_latents(request, run.grid);
  } else {
    start.prompts = pipeline::FluxPipeline::expand_per_image(request, std::move(encoded.pooled),
                                                             std::move(encoded.t5_rows));
    start.latents = run.flux.initial_latents(request, run.grid);
  }
  return start;
}

}  // namespace dp::runtime
