#include "runtime/decode_phase.h"

#include <chrono>
#include <iomanip>

#include "core/error.h"
#include "core/log.h"
#include "core/human_units.h"
#include "core/memory_stats.h"
#include "io/run_dtype.h"
#include "io/torch_tensors.h"
#include "pipeline/device_stats.h"
#include "pipeline/stage_timer.h"
#include "placement/component_placement.h"
#include "placement/plan.h"
#include "runtime/world.h"

namespace dp::runtime {
namespace {

// The VAE's budget on its rank: its --max-memory entry (the GPU that is this rank, or cpu), else free memory.
DecodeBudget decode_budget(const RunContext& run, uint64_t stage_bytes) {
  const ComponentPlace& vae_place = run.components.vae;
  DecodeBudget budget;
  budget.stage_bytes = stage_bytes;
  budget.vae_bytes = vae_place.bytes;
  if (budget.vae_bytes == 0) {
    const auto& vae = run.flux.folder().component("vae");
    budget.vae_bytes = placement::component_bytes(vae, run.flux.folder().config("vae"),
                                                  io::to_safetensors_dtype(run.request.dtype));
  }
  if (!run.options.max_memory.empty()) {
    const auto caps = placement::read_max_memory_argument(run.options.max_memory);
    // GPU d is stage group d (rank d without --sequence-parallel), on a CPU run too (the plan budgets ranks the
    // same way); "cpu" for a VAE the map puts there.
    const auto key = vae_place.on_cpu ? placement::Device::cpu()
                                      : placement::Device::gpu(run.layout().group_of(run.world.rank()));
    if (caps.has(key)) budget.cap_bytes = caps.at(key);
  }
  return budget;
}

}  // namespace

WorkerDecode::WorkerDecode(RunContext& run) : run_(run), seen_(static_cast<size_t>(run.microbatches()), false) {
  const ComponentPlace& vae_place = run.components.vae;
  const auto send_images = [this](int64_t microbatch, const at::Tensor& images) {
    run_.transport->send(0, {MessageKind::images, microbatch, -1, {images}});
  };
  decoder_.emplace(run.flux, run.request, run.grid, run.options.microbatch_size, run.microbatches(),
                   vae_place.device(run.device), run.world.rank(), send_images);
  on_decode_ = [this](Message& message) {
    const int64_t id = message.microbatch;
    const bool known = id >= 0 && id < run_.microbatches() && !seen_[static_cast<size_t>(id)];
    DP_CHECK(message.kind == MessageKind::decode && known && message.tensors.size() == 1 &&
                 message.tensors[0].defined() && message.tensors[0].dim() == 3 &&
                 message.tensors[0].size(0) == run_.microbatch_rows(id),
             "rank ", run_.world.rank(), ": malformed decode message from rank ", message.source, " (",
             message_kind_name(message.kind), ", microbatch ", id, known ? "" : " unknown or repeated", ", ",
             message.tensors.size(), " tensor(s))");
    seen_[static_cast<size_t>(id)] = true;
    decoder_->accept(id, message.tensors[0]);
  };
}

void WorkerDecode::prepare(uint64_t stage_bytes) { decoder_->prepare(decode_budget(run_, stage_bytes), run_.options.warm_up); }

void WorkerDecode::finish() {
  // Decode messages the coordinator sent before the ring's shutdown reached this rank by another path.
  while (decoder_->accepted() < run_.microbatches()) {
    Message message = run_.transport->receive(0);
    on_decode_(message);
  }
  decoder_->finish();
  run_.transport->flush();
  DP_INFO("rank ", run_.world.rank(), ": decoded ", run_.microbatches(), " microbatch(es) in ",
          human_seconds(decoder_->decode_seconds()), " (VAE load ", human_seconds(decoder_->load_seconds()), ")");
}

CoordinatorImages::CoordinatorImages(RunContext& run)
    : run_(run), images_in_(static_cast<size_t>(run.microbatches()), false) {}

int CoordinatorImages::decoding_rank() const { return run_.components.vae.rank; }

void CoordinatorImages::prepare(uint64_t stage_bytes) {
  if (!run_.decode || decoding_rank() != 0) return;
  local_.emplace(run_.flux, run_.request, run_.grid, run_.options.microbatch_size, run_.microbatches(),
                 run_.components.vae.device(run_.device), 0,
                 [this](int64_t microbatch, const at::Tensor& images) { write(microbatch, images, 0); });
  local_->prepare(decode_budget(run_, stage_bytes), run_.options.warm_up);
}

void CoordinatorImages::write(int64_t microbatch, const at::Tensor& images, int rank) {
  run_.outputs.on_images(microbatch * run_.options.microbatch_size, images, rank);
  images_in_[static_cast<size_t>(microbatch)] = true;
  ++written_;
}

void CoordinatorImages::hand_over(int64_t microbatch, const at::Tensor& latents) {
  const int64_t first_row = microbatch * run_.options.microbatch_size;
  DP_INFO("microbatch ", microbatch, " finished (images ", first_row, " to ", first_row + latents.size(0) - 1,
          "): to rank ", decoding_rank(), " to decode");
  ++handed_over_;
  if (local_) local_->accept(microbatch, latents);
  else run_.transport->send(decoding_rank(), {MessageKind::decode, microbatch, -1, {latents}});
}

void CoordinatorImages::take(Message& message) {
  const auto& request = run_.request;
  const int vae_rank = decoding_rank();
  const int64_t id = message.microbatch;
  const bool known = id >= 0 && id < run_.microbatches() && !images_in_[static_cast<size_t>(id)];
  const at::Tensor* images = message.tensors.size() == 1 ? &message.tensors[0] : nullptr;
  const bool shaped = images != nullptr && images->defined() && images->scalar_type() == at::kByte &&
                      images->dim() == 4 && images->size(0) == (known ? run_.microbatch_rows(id) : -1) &&
                      images->size(1) == request.height && images->size(2) == request.width && images->size(3) == 3;
  DP_CHECK(message.kind == MessageKind::images && message.source == vae_rank && known && shaped,
           "rank 0: expected the images of a finished microbatch from rank ", vae_rank, ", got a ",
           message_kind_name(message.kind), " message from rank ", message.source, " (microbatch ", id,
           known ? "" : ", unknown or already written", images && images->defined() ? str(", ", images->sizes()) : "",
           ")");
  // The writers read host memory; over NCCL the images arrive on this rank's GPU (the decoding rank may be
  // the ring's last stage, whose link to rank 0 is an NCCL one).
  write(id, images->to(at::kCPU), vae_rank);
}

void CoordinatorImages::finish() {
  // The decode stage's report. With the VAE resident its work interleaves with denoising (and is inside the
  // denoise stage's wall time too): the report books the VAE's load and decode seconds. When another rank
  // decodes, it books what rank 0 spends waiting for the last images after denoising.
  const auto decode_started = std::chrono::steady_clock::now();
  if (local_) {
    local_->finish();
  } else {
    while (written_ < run_.microbatches()) {
      Message message = run_.transport->receive(decoding_rank());
      take(message);
    }
  }
  pipeline::StageReport report;
  report.name = "decode";
  report.load_seconds = local_ ? local_->load_seconds() : 0.0;
  report.seconds = local_ ? local_->load_seconds() + local_->decode_seconds() : pipeline::seconds_since(decode_started);
  report.peak_resident_bytes = peak_resident_bytes();
  report.peak_device_bytes = run_.device.is_cuda() ? pipeline::peak_memory_bytes(run_.device) : 0;
  DP_INFO("stage decode: ", run_.microbatches(), " microbatch(es) decoded on rank ", decoding_rank(), "; ",
          human_seconds(report.seconds), local_ ? str(" (VAE load ", human_seconds(report.load_seconds), ")")
                                                : std::string(" waiting for the last images"));
  run_.flux.report_sink()->push_back(report);
}

void CoordinatorImages::check_all_written() const {
  DP_CHECK(written_ == run_.microbatches(), "rank 0: ", written_, " of ", run_.microbatches(),
           " microbatches' images were written");
}

}  // namespace dp::runtime
