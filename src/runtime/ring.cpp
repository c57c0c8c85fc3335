#include "runtime/ring.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace dp::runtime {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A device-timed transport's finished transfers, added to the send and receive figures.
void add_transfer_spans(RankTimes& times, Transport* transport) {
  if (transport == nullptr || !transport->times_transfers_on_device()) return;
  for (const auto& span : transport->take_transfer_spans()) {
    if (span.step < 0) continue;  // prompts: not a denoising step's traffic
    if (span.outbound) {
      times.send_seconds += span.seconds;
      times.at_step(span.step).send_seconds += span.seconds;
    } else {
      times.wait_seconds += span.seconds;
      times.at_step(span.step).receive_seconds += span.seconds;
    }
  }
}

// Host time spent in send or receive, for a transport whose transfers are not timed on the device.
void add_host_transfer(RankTimes& times, const Transport& transport, int step, bool outbound, double seconds) {
  if (transport.times_transfers_on_device()) return;
  if (outbound) {
    times.send_seconds += seconds;
    if (step >= 0) times.at_step(step).send_seconds += seconds;
  } else {
    times.wait_seconds += seconds;
    if (step >= 0) times.at_step(step).receive_seconds += seconds;
  }
}

}  // namespace

RankTimes::Step& RankTimes::at_step(int step) {
  if (step >= static_cast<int>(per_step.size())) per_step.resize(static_cast<size_t>(step) + 1);
  return per_step[static_cast<size_t>(std::max(step, 0))];
}

RingLayout::RingLayout(std::vector<placement::RankStage> stages, int world_size)
    : stages_(std::move(stages)), world_size_(world_size) {
  DP_CHECK(!stages_.empty(), "the device map gives no rank any transformer block");
  for (size_t i = 1; i < stages_.size(); ++i)
    DP_CHECK(stages_[i].rank != 0, "rank 0 (the coordinator) holds blocks [", stages_[i].first_block, ", ",
             stages_[i].last_block, ") but not the first ones; it can only start the ring: give GPU 0 the first "
             "blocks or none");
}

const placement::RankStage* RingLayout::stage_of(int rank) const {
  for (const auto& s : stages_)
    if (s.rank == rank) return &s;
  return nullptr;
}

int RingLayout::previous(int rank) const {
  for (size_t i = 0; i < stages_.size(); ++i)
    if (stages_[i].rank == rank) return i == 0 ? 0 : stages_[i - 1].rank;
  return 0;  // idle ranks hear only from the coordinator
}

int RingLayout::next(int rank) const {
  for (size_t i = 0; i < stages_.size(); ++i)
    if (stages_[i].rank == rank) return i + 1 == stages_.size() ? 0 : stages_[i + 1].rank;
  return 0;
}

RingExecutor::RingExecutor(const RingLayout& layout, Transport* transport,
                           std::shared_ptr<pipeline::FluxStage> local_stage, const at::Device& device,
                           double timeout_seconds)
    : layout_(layout), transport_(transport), local_(std::move(local_stage)), clock_(device),
      timeout_seconds_(timeout_seconds) {
  DP_CHECK(layout_.coordinator_runs_first_stage() == (local_ != nullptr),
           "the coordinator's first stage and the ring layout disagree");
}

Transport& RingExecutor::transport() {
  DP_CHECK(transport_ != nullptr, "the ring needs a transport to reach rank ", layout_.first_rank());
  return *transport_;
}

void RingExecutor::send_prompts(int64_t microbatch, const at::Tensor& prompt_embeds, const at::Tensor& pooled) {
  if (local_) {
    local_->set_prompts(microbatch, prompt_embeds, pooled);
    return;
  }
  transport().send(layout_.first_rank(), {MessageKind::prompts, microbatch, -1, {prompt_embeds, pooled}});
}

void RingExecutor::submit(int64_t microbatch, int step, std::vector<at::Tensor> inputs) {
  if (!local_) {
    transport().send(layout_.first_rank(), {MessageKind::step, microbatch, step, std::move(inputs)});
    return;
  }
  clock_.begin();
  auto outputs = local_->run(microbatch, inputs);
  clock_.end(step);
  clock_.collect(times_, false, timeout_seconds_);
  ++times_.at_step(step).microbatches;
  ++times_.steps;
  if (local_->is_last()) {
    local_results_.push_back({microbatch, step, std::move(outputs[0])});
    return;
  }
  const auto sending = std::chrono::steady_clock::now();
  transport().send(layout_.next(0), {MessageKind::activations, microbatch, step, std::move(outputs)});
  add_host_transfer(times_, transport(), step, true, seconds_since(sending));
}

void RingExecutor::listen_to(int peer, std::function<void(Message&)> handler) {
  side_peer_ = peer;
  side_handler_ = std::move(handler);
}

pipeline::StepResult RingExecutor::wait_result() {
  // When rank 0 runs the whole ring, nothing below receives: take the images that have arrived here, so that
  // they are written as they come and the decoding rank's sends never back up.
  const bool whole_ring_here = local_ && local_->is_last();
  while (whole_ring_here && side_handler_ && transport_ != nullptr && transport_->has_message(side_peer_)) {
    Message message = transport_->receive(side_peer_);
    side_handler_(message);  // checks that it is the images it expects
  }
  if (!local_results_.empty()) {
    auto result = std::move(local_results_.front());
    local_results_.erase(local_results_.begin());
    return result;
  }
  std::vector<int> peers = {layout_.last_rank()};
  if (side_handler_ && side_peer_ != layout_.last_rank()) peers.push_back(side_peer_);
  for (;;) {
    const auto started = std::chrono::steady_clock::now();
    Message message = transport().receive_any(peers);
    times_.host_wait_seconds += seconds_since(started);
    if (side_handler_ && message.source == side_peer_ && message.kind != MessageKind::noise) {
      side_handler_(message);
      continue;
    }
    add_host_transfer(times_, transport(), message.step, false, seconds_since(started));
    // A result consumed: the device spans that finished meanwhile are read without waiting.
    clock_.collect(times_, false, timeout_seconds_);
    add_transfer_spans(times_, transport_);
    DP_CHECK(message.kind == MessageKind::noise && message.source == layout_.last_rank() &&
                 message.tensors.size() == 1 && message.tensors[0].defined(),
             "rank 0: expected a noise prediction from rank ", layout_.last_rank(), ", got a ",
             message_kind_name(message.kind), " message with ", message.tensors.size(), " tensor(s) from rank ",
             message.source);
    return {message.microbatch, message.step, std::move(message.tensors[0])};
  }
}

void RingExecutor::release(int64_t microbatch) {
  if (local_) {
    local_->forget(microbatch);
    return;
  }
  transport().send(layout_.first_rank(), {MessageKind::release, microbatch, -1, {}});
}

int RingExecutor::max_in_flight() const { return static_cast<int>(layout_.stages().size()); }

void RingExecutor::shutdown() {
  // Round the ring from its first worker, plus every rank without blocks.
  if (layout_.world_size() == 1) {
    clock_.collect(times_, true, timeout_seconds_);
    return;
  }
  const int first_worker = local_ ? layout_.next(0) : layout_.first_rank();
  if (first_worker != 0) transport().send(first_worker, {MessageKind::shutdown, -1, -1, {}});
  for (int r = 1; r < layout_.world_size(); ++r)
    if (layout_.stage_of(r) == nullptr) transport().send(r, {MessageKind::shutdown, -1, -1, {}});
  transport().flush();
  clock_.collect(times_, true, timeout_seconds_);
  add_transfer_spans(times_, transport_);
}

RankTimes run_stage_worker(int rank, const RingLayout& layout, Transport& transport, pipeline::FluxStage* stage,
                           const at::Device& device, double timeout_seconds,
                           const std::function<void(Message&)>& on_decode) {
  RankTimes times;
  ComputeClock clock(device);
  const auto began = std::chrono::steady_clock::now();
  const int from = layout.previous(rank), to = layout.next(rank);
  std::vector<int> peers = {from};
  if (on_decode && from != 0) peers.push_back(0);
  for (;;) {
    const auto waiting = std::chrono::steady_clock::now();
    Message message = transport.receive_any(peers);
    if (message.kind == MessageKind::decode && on_decode && message.source == 0) {
      on_decode(message);
      continue;
    }
    if (message.source != from)
      DP_FAIL("rank ", rank, ": unexpected ", message_kind_name(message.kind), " message from rank ", message.source);
    const double waited = seconds_since(waiting);
    times.host_wait_seconds += waited;
    const bool step_input = message.kind == MessageKind::step || message.kind == MessageKind::activations;
    add_host_transfer(times, transport, step_input ? message.step : -1, false, waited);
    clock.collect(times, false, timeout_seconds);
    add_transfer_spans(times, &transport);
    const auto unexpected = [&] {
      DP_FAIL("rank ", rank, ": unexpected ", message_kind_name(message.kind), " message from rank ", from,
              stage ? "" : " (this rank holds no blocks)");
    };
    switch (message.kind) {
      case MessageKind::shutdown:
        if (stage != nullptr && to != 0) transport.send(to, std::move(message));
        // The decoding rank flushes after its last images: waiting here for images the coordinator takes only
        // after its own sends are delivered could hold both until the timeout.
        if (!on_decode) transport.flush();
        clock.collect(times, true, timeout_seconds);
        add_transfer_spans(times, &transport);
        times.wall_seconds = seconds_since(began);
        return times;
      case MessageKind::prompts:
        if (stage == nullptr || !stage->is_first() || message.tensors.size() != 2) unexpected();
        stage->set_prompts(message.microbatch, message.tensors[0], message.tensors[1]);
        break;
      case MessageKind::release:
        if (stage == nullptr || !stage->is_first()) unexpected();
        stage->forget(message.microbatch);
        break;
      case MessageKind::step:
      case MessageKind::activations: {
        if (stage == nullptr || (message.kind == MessageKind::step) != stage->is_first()) unexpected();
        clock.begin();
        auto outputs = stage->run(message.microbatch, message.tensors);
        clock.end(message.step);
        ++times.at_step(message.step).microbatches;
        ++times.steps;
        const MessageKind kind = stage->is_last() ? MessageKind::noise : MessageKind::activations;
        const auto sending = std::chrono::steady_clock::now();
        transport.send(to, {kind, message.microbatch, message.step, std::move(outputs)});
        add_host_transfer(times, transport, message.step, true, seconds_since(sending));
        break;
      }
      case MessageKind::noise:
      case MessageKind::embeddings:
      case MessageKind::decode:
      case MessageKind::images:
        unexpected();
    }
  }
}

}  // namespace dp::runtime
