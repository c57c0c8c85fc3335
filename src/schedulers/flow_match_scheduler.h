#pragma once
// FlowMatchEulerDiscreteScheduler as diffusers defines it, for the FLUX pipeline: the schedule of sigmas and
// timesteps (static shift, dynamic shift from mu, custom sigmas, the appended final sigma) and the Euler step.
// The schedule reproduces diffusers' float32 arithmetic operation by operation, so the values are bit-equal.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "models/scheduler/flow_match_config.h"  // FlowMatchSchedulerConfig, parsed torch-free

namespace dp::schedulers {

// FluxPipeline.calculate_shift: mu grows linearly with the packed image sequence length (not clamped).
double flux_calculate_shift(int64_t image_seq_len, int base_seq_len = 256, int max_seq_len = 4096,
                            double base_shift = 0.5, double max_shift = 1.15);
double flux_calculate_shift(int64_t image_seq_len, const FlowMatchSchedulerConfig& config);
// FluxPipeline's default sigmas: np.linspace(1.0, 1/N, N) in float64.
std::vector<double> flux_default_sigmas(int num_inference_steps);

class FlowMatchEulerScheduler {
 public:
  explicit FlowMatchEulerScheduler(FlowMatchSchedulerConfig config);

  // set_timesteps(num_inference_steps) without custom sigmas: linspace between the training schedule's ends.
  // mu is required when the config uses dynamic shifting and ignored otherwise.
  void set_timesteps(int num_inference_steps, const double* mu = nullptr);
  // set_timesteps(sigmas=...), as FluxPipeline calls it; the values are cast to float32 first as diffusers does.
  void set_timesteps_from_sigmas(const std::vector<double>& sigmas, const double* mu = nullptr);

  // Timesteps (N values) and sigmas (N + 1 values, the last one 0, or 1 with invert_sigmas), float32.
  const std::vector<float>& timesteps() const { return timesteps_; }
  const std::vector<float>& sigmas() const { return sigmas_; }
  int num_inference_steps() const { return static_cast<int>(timesteps_.size()); }
  const FlowMatchSchedulerConfig& config() const { return config_; }

  // The Euler update of step `step_index` (0-based): sample + (sigma[i+1] - sigma[i]) * model_output, with the
  // sample in float32 and the product in the model output's dtype, as diffusers' type promotion gives; the
  // result is cast back to the model output's dtype.
  at::Tensor step(const at::Tensor& model_output, int step_index, const at::Tensor& sample) const;

 private:
  std::vector<float> apply_shift(std::vector<float> sigmas, const double* mu) const;
  std::vector<double> apply_shift(std::vector<double> sigmas, const double* mu) const;
  void finish(const std::vector<float>& shifted_sigmas);

  FlowMatchSchedulerConfig config_;
  float sigma_min_ = 0.0f;  // ends of the training schedule, as __init__ computes them
  float sigma_max_ = 1.0f;
  std::vector<float> timesteps_;
  std::vector<float> sigmas_;
};

}  // namespace dp::schedulers
