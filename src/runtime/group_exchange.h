#pragma once
// The model's SequenceExchange (models/flux/sequence_parallel.h) over this rank's transport: the all-to-alls of
// its sequence group, each filed under the denoising step the ring is running, for --report.
#include "models/flux/sequence_parallel.h"
#include "runtime/transport.h"

namespace dp::runtime {

class GroupExchange : public models::flux::SequenceExchange {
 public:
  explicit GroupExchange(Transport& transport) : transport_(transport) {}
  // The step of the work that follows (the ring sets it before each stage run).
  void at_step(int step) { step_ = step; }
  void all_to_all(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv) override {
    transport_.all_to_all(send, recv, step_);
  }

 private:
  Transport& transport_;
  int step_ = -1;
};

}  // namespace dp::runtime
