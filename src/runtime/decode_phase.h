#pragma once
// The decode phase: the rank the component map gives the VAE (rank 0 without one) decodes each microbatch as
// it finishes (runtime/microbatch_decoder.h) and the coordinator writes its images as they come. The phase
// interleaves with the ring: both sides exist before denoising starts and finish after it.
#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <vector>

#include "runtime/microbatch_decoder.h"
#include "runtime/run_context.h"

namespace dp::runtime {

// The decoding rank other than 0: takes the coordinator's decode messages and sends the images back.
class WorkerDecode {
 public:
  explicit WorkerDecode(RunContext& run);
  WorkerDecode(const WorkerDecode&) = delete;  // its handlers point at it
  WorkerDecode& operator=(const WorkerDecode&) = delete;
  // Before denoising, once this rank's blocks are loaded (`stage_bytes` of them): loads the VAE if it fits.
  void prepare(uint64_t stage_bytes);
  // Takes one decode message; for the ring worker, which receives them between ring messages.
  const std::function<void(Message&)>& handler() const { return on_decode_; }
  // After denoising, once the blocks are freed: takes the decode messages not yet taken, decodes what was kept,
  // and waits until the images are delivered.
  void finish();

 private:
  RunContext& run_;
  std::optional<MicrobatchDecoder> decoder_;
  std::vector<bool> seen_;
  std::function<void(Message&)> on_decode_;
};

// The coordinator's side: writes the images of each microbatch, decoded here or received from the decoding rank.
class CoordinatorImages {
 public:
  explicit CoordinatorImages(RunContext& run);
  CoordinatorImages(const CoordinatorImages&) = delete;  // the local decoder's delivery points at it
  CoordinatorImages& operator=(const CoordinatorImages&) = delete;
  // Before denoising, once rank 0's blocks are loaded: the VAE is prepared when rank 0 decodes.
  void prepare(uint64_t stage_bytes);
  // A microbatch's final latents, decoded here or sent to the decoding rank.
  void hand_over(int64_t microbatch, const at::Tensor& latents);
  // Images from the decoding rank, checked before anything is written (the ring listens with this).
  void take(Message& message);
  int decoding_rank() const;
  // Whether every microbatch has finished and been handed over to decode: a run stopped at the last step's
  // boundary then still writes the last images (decoded only once the blocks are freed, here or on the VAE's rank).
  bool every_microbatch_handed_over() const { return handed_over_ == run_.microbatches(); }
  // After denoising (the blocks freed): decodes what was kept, or waits for the decoding rank's last images; adds
  // the decode stage's report.
  void finish();
  void check_all_written() const;

 private:
  void write(int64_t microbatch, const at::Tensor& images, int rank);

  RunContext& run_;
  std::optional<MicrobatchDecoder> local_;
  std::vector<bool> images_in_;
  int64_t handed_over_ = 0;
  int64_t written_ = 0;
};

}  // namespace dp::runtime
