#include "runtime/ring.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"

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

// A stage run's all-to-alls, once finished (bounded): a dead peer of the group ends the wait within the timeout
// here rather than in a later synchronisation of the device.
void add_exchanges(RankTimes& times, Transport* transport, const GroupExchange* exchange) {
  if (transport == nullptr || exchange == nullptr) return;
  transport->finish_exchanges();
  for (const auto& span : transport->take_exchange_spans()) {
    times.exchange_seconds += span.seconds;
    ++times.exchanges;
    if (span.step >= 0) times.at_step(span.step).exchange_seconds += span.seconds;
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

// Token shard `range` of a (batch, tokens, ...) tensor for one rank of a sequence group; the whole tensor when
// the group is one rank.
at::Tensor token_shard_of(const at::Tensor& t, placement::TokenRange range, int sequence_parallel) {
  if (sequence_parallel == 1) return t;
  return t.narrow(1, range.first, range.count).contiguous();
}

// --trace's names: a stage's work and a message, by microbatch and (1-based) denoising step.
std::string compute_span_name(const pipeline::FluxStage& stage, int64_t microbatch, int step) {
  return str("blocks [", stage.first_block(), ",", stage.last_block(), ") mb ", microbatch, " step ", step + 1);
}

std::string message_span_name(const char* verb, MessageKind kind, int64_t microbatch, int step, const char* direction,
                              int peer) {
  std::string name = str(verb, " ", message_kind_name(kind));
  if (microbatch >= 0) name += str(" mb ", microbatch);
  if (step >= 0) name += str(" step ", step + 1);
  return name + str(" ", direction, " rank ", peer);
}

// A send, timed for --trace (on the host: what the sender spent handing it over).
void traced_send(Transport& transport, int to, Message message) {
  if (!trace::recording()) {
    transport.send(to, std::move(message));
    return;
  }
  const std::string name = message_span_name("send", message.kind, message.microbatch, message.step, "to", to);
  const int64_t started = trace::now_us();
  transport.send(to, std::move(message));
  trace::complete(trace::Track::send, name, started, trace::now_us() - started);
}

void trace_receive(const Message& message, int64_t started_us) {
  if (!trace::recording()) return;
  trace::complete(trace::Track::receive,
                  message_span_name("receive", message.kind, message.microbatch, message.step, "from", message.source),
                  started_us, trace::now_us() - started_us);
}

}  // namespace

RankTimes::Step& RankTimes::at_step(int step) {
  if (step >= static_cast<int>(per_step.size())) per_step.resize(static_cast<size_t>(step) + 1);
  return per_step[static_cast<size_t>(std::max(step, 0))];
}

RingExecutor::RingExecutor(const MeshLayout& layout, Transport* transport,
                           std::shared_ptr<pipeline::FluxStage> local_stage, const at::Device& device,
                           double timeout_seconds, GroupExchange* exchange)
    : layout_(layout), transport_(transport), local_(std::move(local_stage)), clock_(device),
      timeout_seconds_(timeout_seconds), exchange_(exchange) {
  DP_CHECK(layout_.coordinator_runs_first_stage() == (local_ != nullptr),
           "the coordinator's first stage and the ring layout disagree");
}

Transport& RingExecutor::transport() {
  DP_CHECK(transport_ != nullptr, "the ring needs a transport to reach rank ", layout_.first_rank());
  return *transport_;
}

void RingExecutor::send_prompts(int64_t microbatch, const at::Tensor& prompt_embeds, const at::Tensor& pooled) {
  const auto ranks = layout_.first_ranks();
  for (int k = 0; k < layout_.sequence_parallel(); ++k) {
    at::Tensor text = token_shard_of(prompt_embeds, layout_.text_shard(k), layout_.sequence_parallel());
    if (ranks[k] == 0) local_->set_prompts(microbatch, text, pooled);
    else transport().send(ranks[k], {MessageKind::prompts, microbatch, -1, {std::move(text), pooled}});
  }
}

void RingExecutor::send_schedule(int64_t microbatch, const pipeline::StepSchedule& schedule) {
  if (takes_schedule()) local_->set_schedule(microbatch, schedule);
}

void RingExecutor::submit(int64_t microbatch, int step, std::vector<at::Tensor> inputs) {
  // Every shard's latents leave before rank 0 computes its own: the group's ranks meet in all-to-alls inside it.
  const auto ranks = layout_.first_ranks();
  std::vector<at::Tensor> local_inputs;
  for (int k = 0; k < layout_.sequence_parallel(); ++k) {
    std::vector<at::Tensor> shard = inputs;
    shard[0] = token_shard_of(inputs[0], layout_.image_shard(k), layout_.sequence_parallel());
    if (ranks[k] == 0) local_inputs = std::move(shard);
    else traced_send(transport(), ranks[k], {MessageKind::step, microbatch, step, std::move(shard)});
  }
  if (!local_) return;
  if (exchange_ != nullptr) exchange_->at_step(step);
  clock_.begin(compute_span_name(*local_, microbatch, step));
  auto outputs = local_->run(microbatch, local_inputs, step);
  clock_.end(step);
  add_exchanges(times_, transport_, exchange_);
  clock_.collect(times_, false, timeout_seconds_);
  ++times_.at_step(step).microbatches;
  ++times_.steps;
  if (local_->is_last()) {
    local_results_.push_back({microbatch, step, std::move(outputs[0])});
    return;
  }
  const auto sending = std::chrono::steady_clock::now();
  traced_send(transport(), layout_.next(0), {MessageKind::activations, microbatch, step, std::move(outputs)});
  add_host_transfer(times_, transport(), step, true, seconds_since(sending));
}

void RingExecutor::listen_to(int peer, std::function<void(Message&)> handler) {
  side_peer_ = peer;
  side_handler_ = std::move(handler);
}

pipeline::StepResult RingExecutor::wait_result() {
  const auto last = layout_.last_ranks();
  const bool whole_ring_here = local_ && local_->is_last() && last.size() == 1;
  // When rank 0 runs the whole ring, nothing below receives: take the images that have arrived here, so that
  // they are written as they come and the decoding rank's sends never back up.
  while (whole_ring_here && side_handler_ && transport_ != nullptr && transport_->has_message(side_peer_)) {
    Message message = transport_->receive(side_peer_);
    side_handler_(message);  // checks that it is the images it expects
  }
  std::vector<pipeline::StepResult> shards;
  if (local_ && local_->is_last()) {
    DP_CHECK(!local_results_.empty(), "rank 0: waiting for a step that was never submitted");
    shards.push_back(std::move(local_results_.front()));
    local_results_.erase(local_results_.begin());
    if (whole_ring_here) return std::move(shards.front());
  }
  for (int rank : last)
    if (rank != 0) shards.push_back(receive_noise(rank));
  if (shards.size() == 1) return std::move(shards.front());
  // The shards are the noise prediction's image tokens in order, all of one step of one microbatch: every
  // chain of the mesh carries the steps in the order rank 0 submitted them.
  std::vector<at::Tensor> parts;
  for (size_t k = 0; k < shards.size(); ++k) {
    DP_CHECK(shards[k].microbatch == shards[0].microbatch && shards[k].step == shards[0].step, "rank 0: token shard ",
             k, " of the noise prediction (from rank ", last[k], ") is of microbatch ", shards[k].microbatch, " step ",
             shards[k].step, ", shard 0 of microbatch ", shards[0].microbatch, " step ", shards[0].step);
    // Shards that came over the MPI transport arrive in host memory, rank 0's own on its device: join them on
    // the device of shard 0 (the loop moves the whole to the latents' device anyway).
    parts.push_back(shards[k].noise_pred.to(shards[0].noise_pred.device()));
  }
  return {shards[0].microbatch, shards[0].step, at::cat(parts, 1)};
}

pipeline::StepResult RingExecutor::receive_noise(int peer) {
  std::vector<int> peers = {peer};
  if (side_handler_ && side_peer_ != peer) peers.push_back(side_peer_);
  for (;;) {
    const auto started = std::chrono::steady_clock::now();
    const int64_t started_us = trace::now_us();
    Message message = transport().receive_any(peers);
    times_.host_wait_seconds += seconds_since(started);
    trace_receive(message, started_us);
    if (side_handler_ && message.source == side_peer_ && message.kind != MessageKind::noise) {
      side_handler_(message);
      continue;
    }
    add_host_transfer(times_, transport(), message.step, false, seconds_since(started));
    // A result consumed: the device spans that finished meanwhile are read without waiting.
    clock_.collect(times_, false, timeout_seconds_);
    add_transfer_spans(times_, transport_);
    DP_CHECK(message.kind == MessageKind::noise && message.source == peer && message.tensors.size() == 1 &&
                 message.tensors[0].defined(),
             "rank 0: expected a noise prediction from rank ", peer, ", got a ", message_kind_name(message.kind),
             " message with ", message.tensors.size(), " tensor(s) from rank ", message.source);
    return {message.microbatch, message.step, std::move(message.tensors[0])};
  }
}

void RingExecutor::release(int64_t microbatch) {
  for (int rank : layout_.first_ranks()) {
    if (rank == 0) local_->forget(microbatch);
    else transport().send(rank, {MessageKind::release, microbatch, -1, {}});
  }
}

int RingExecutor::max_in_flight() const { return static_cast<int>(layout_.stages().size()); }

void RingExecutor::shutdown() {
  // Round the ring of every shard from its first worker, plus every rank without blocks.
  if (layout_.world_size() == 1) {
    clock_.collect(times_, true, timeout_seconds_);
    return;
  }
  for (int first : layout_.first_ranks()) {
    const int first_worker = first == 0 ? layout_.next(0) : first;
    if (first_worker != 0) transport().send(first_worker, {MessageKind::shutdown, -1, -1, {}});
  }
  for (int r = 1; r < layout_.world_size(); ++r)
    if (layout_.stage_of(r) == nullptr) transport().send(r, {MessageKind::shutdown, -1, -1, {}});
  transport().flush();
  clock_.collect(times_, true, timeout_seconds_);
  add_transfer_spans(times_, transport_);
}

RankTimes run_stage_worker(int rank, const MeshLayout& layout, Transport& transport, pipeline::FluxStage* stage,
                           const at::Device& device, double timeout_seconds,
                           const std::function<void(Message&)>& on_decode, GroupExchange* exchange) {
  RankTimes times;
  ComputeClock clock(device);
  const auto began = std::chrono::steady_clock::now();
  const int from = layout.previous(rank), to = layout.next(rank);
  std::vector<int> peers = {from};
  if (on_decode && from != 0) peers.push_back(0);
  for (;;) {
    const auto waiting = std::chrono::steady_clock::now();
    const int64_t waiting_us = trace::now_us();
    Message message = transport.receive_any(peers);
    trace_receive(message, waiting_us);
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
        if (exchange != nullptr) exchange->at_step(message.step);
        clock.begin(compute_span_name(*stage, message.microbatch, message.step));
        auto outputs = stage->run(message.microbatch, message.tensors);
        clock.end(message.step);
        add_exchanges(times, &transport, exchange);
        ++times.at_step(message.step).microbatches;
        ++times.steps;
        const MessageKind kind = stage->is_last() ? MessageKind::noise : MessageKind::activations;
        const auto sending = std::chrono::steady_clock::now();
        traced_send(transport, to, {kind, message.microbatch, message.step, std::move(outputs)});
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
