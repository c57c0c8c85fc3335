#pragma once
// The denoising ring: coordinator (rank 0) -> stage 0 -> ... -> last stage -> coordinator, once per token shard
// of a mesh (runtime/mesh_layout.h). Rank 0 may run the first stage (its shard 0) itself; ranks without blocks
// idle until the run ends. The coordinator's side is a pipeline::StageExecutor, so pipeline/denoise_loop.h
// drives one rank or N the same way.
#include <functional>
#include <memory>
#include <vector>

#include "pipeline/denoise_loop.h"
#include "pipeline/flux_stage.h"
#include "placement/ring_stages.h"
#include "runtime/compute_clock.h"
#include "runtime/group_exchange.h"
#include "runtime/mesh_layout.h"
#include "runtime/transport.h"

namespace dp::runtime {

// Per-rank figures for --report, in total and per denoising step (summed over the step's microbatches).
// On CUDA, compute is device time (CUDA events round the stage's forward); send and receive are device time
// when the transport times its transfers on the device (NCCL: the transfer on its stream), else host time.
// A device-timed send starts once the tensors are ready; a device-timed receive starts when it is posted, as
// soon as the header arrives, so it also holds the sender's remaining compute: the send is the transfer.
struct RankTimes {
  struct Step {
    double compute_seconds = 0;  // the stage's forward
    double receive_seconds = 0;  // host: blocked waiting for this step's input (or, on rank 0, its result);
                                 // device: the receiving transfers of this step
    double send_seconds = 0;     // host: staging and queueing this step's output; device: its sending transfers
    double exchange_seconds = 0;  // the sequence group's all-to-alls (part of compute_seconds)
    int64_t microbatches = 0;
  };
  double compute_seconds = 0;
  double wait_seconds = 0;  // receiving, whatever the message (host or device time, as above)
  double send_seconds = 0;
  double host_wait_seconds = 0;  // the host blocked in receive, whatever the clock of the figures above
  // The sequence group's all-to-alls, on the transport's clock (device for NCCL, host for MPI); they happen
  // inside the stage's forward, so compute_seconds includes them.
  double exchange_seconds = 0;
  int64_t exchanges = 0;
  int64_t steps = 0;        // microbatch steps this rank computed
  double wall_seconds = 0;  // the denoising phase on this rank, from its first wait to the shutdown
  std::vector<Step> per_step;
  Step& at_step(int step);  // grows per_step as needed
};

// The coordinator's executor. `local_stage` is the first stage when rank 0 runs it, else null.
class RingExecutor : public pipeline::StageExecutor {
 public:
  // transport may be null in a world of one (nothing is sent). `device` is the coordinator's (its compute is
  // timed there); timeout_seconds bounds the final wait for the timing of queued device work. `exchange`: the
  // local stage's sequence group exchange, when rank 0 shares the first stage with other ranks.
  RingExecutor(const MeshLayout& layout, Transport* transport, std::shared_ptr<pipeline::FluxStage> local_stage,
               const at::Device& device, double timeout_seconds, GroupExchange* exchange = nullptr);
  void send_prompts(int64_t microbatch, const at::Tensor& prompt_embeds, const at::Tensor& pooled) override;
  // Rank 0's own first stage only: other ranks (a sequence group's other members, later stages) compute their
  // modulation rows a step at a time, the same bits.
  bool takes_schedule() const override { return local_ != nullptr && local_->takes_schedule(); }
  void send_schedule(int64_t microbatch, const pipeline::StepSchedule& schedule) override;
  void submit(int64_t microbatch, int step, std::vector<at::Tensor> inputs) override;
  pipeline::StepResult wait_result() override;
  void release(int64_t microbatch) override;
  int max_in_flight() const override;
  // While waiting for results, also takes the messages `peer` sends that are not noise predictions (the
  // decoding rank's images) and hands them to `handler`, so that they are written as they come.
  void listen_to(int peer, std::function<void(Message&)> handler);
  // Ends the run on every other rank (shutdown round the ring and to idle ranks), waits for delivery and for
  // the timing of the device work to resolve.
  void shutdown();
  const RankTimes& times() const { return times_; }

 private:
  // A noise prediction (or its token shard) from `peer`, taking the side peer's messages meanwhile.
  pipeline::StepResult receive_noise(int peer);
  const MeshLayout& layout_;
  Transport& transport();
  Transport* transport_;
  std::shared_ptr<pipeline::FluxStage> local_;
  std::vector<pipeline::StepResult> local_results_;
  ComputeClock clock_;
  double timeout_seconds_;
  RankTimes times_;
  int side_peer_ = -1;
  std::function<void(Message&)> side_handler_;
  GroupExchange* exchange_;
};

// A rank other than 0: runs its stage for every message until shutdown (idle ranks just wait for it). On the
// decoding rank `on_decode` takes the coordinator's decode messages as they arrive, between ring messages.
// `exchange`: the stage's sequence group exchange (null when the group is this rank alone).
RankTimes run_stage_worker(int rank, const MeshLayout& layout, Transport& transport, pipeline::FluxStage* stage,
                           const at::Device& device, double timeout_seconds,
                           const std::function<void(Message&)>& on_decode = {}, GroupExchange* exchange = nullptr);

}  // namespace dp::runtime
