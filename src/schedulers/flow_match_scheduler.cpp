#include "schedulers/flow_match_scheduler.h"

#include <cmath>
#include <utility>

#include "core/error.h"

namespace dp::schedulers {
namespace {

// numpy.linspace(start, stop, num) in float64: i * step + start, with the last value set to stop exactly.
std::vector<double> numpy_linspace(double start, double stop, int num) {
  std::vector<double> values(static_cast<size_t>(num));
  const int div = num - 1;
  const double delta = stop - start;
  const double step = div > 0 ? delta / div : 0.0;
  for (int i = 0; i < num; ++i) {
    double y;
    if (div <= 0) {
      y = static_cast<double>(i) * delta;
    } else if (step == 0.0) {
      y = (static_cast<double>(i) / div) * delta;
    } else {
      y = static_cast<double>(i) * step;
    }
    values[static_cast<size_t>(i)] = y + start;
  }
  if (num > 1) values.back() = stop;
  return values;
}

}  // namespace

double flux_calculate_shift(int64_t image_seq_len, int base_seq_len, int max_seq_len, double base_shift,
                            double max_shift) {
  DP_CHECK(max_seq_len != base_seq_len, "calculate_shift: max_image_seq_len equals base_image_seq_len (",
           base_seq_len, ")");
  const double m = (max_shift - base_shift) / (max_seq_len - base_seq_len);
  const double b = base_shift - m * base_seq_len;
  return static_cast<double>(image_seq_len) * m + b;
}

double flux_calculate_shift(int64_t image_seq_len, const FlowMatchSchedulerConfig& config) {
  return flux_calculate_shift(image_seq_len, config.base_image_seq_len, config.max_image_seq_len, config.base_shift,
                              config.max_shift);
}

std::vector<double> flux_default_sigmas(int num_inference_steps) {
  DP_CHECK(num_inference_steps > 0, "num_inference_steps must be positive, got ", num_inference_steps);
  return numpy_linspace(1.0, 1.0 / num_inference_steps, num_inference_steps);
}

FlowMatchEulerScheduler::FlowMatchEulerScheduler(FlowMatchSchedulerConfig config) : config_(std::move(config)) {
  // __init__'s training schedule in float32; only its two ends matter afterwards.
  const int n = config_.num_train_timesteps;
  const float shift = static_cast<float>(config_.shift);
  const float shift_minus_one = static_cast<float>(config_.shift - 1.0);
  auto training_sigma = [&](int timestep) {
    const float sigma = static_cast<float>(timestep) / static_cast<float>(n);
    if (config_.use_dynamic_shifting) return sigma;
    return shift * sigma / (1.0f + shift_minus_one * sigma);
  };
  sigma_max_ = training_sigma(n);
  sigma_min_ = training_sigma(1);
}

std::vector<float> FlowMatchEulerScheduler::apply_shift(std::vector<float> sigmas, const double* mu) const {
  if (config_.use_dynamic_shifting) {
    DP_CHECK(mu != nullptr, "FlowMatchEulerScheduler: mu must be given when use_dynamic_shifting is true");
    // numpy keeps the float32 array type and casts the Python float scalar to float32.
    const bool exponential = config_.time_shift_type == "exponential";
    const float numerator = static_cast<float>(exponential ? std::exp(*mu) : *mu);
    for (float& t : sigmas) t = numerator / (numerator + (1.0f / t - 1.0f));
  } else {
    const float shift = static_cast<float>(config_.shift);
    const float shift_minus_one = static_cast<float>(config_.shift - 1.0);
    for (float& s : sigmas) s = shift * s / (1.0f + shift_minus_one * s);
  }
  return sigmas;
}

std::vector<double> FlowMatchEulerScheduler::apply_shift(std::vector<double> sigmas, const double* mu) const {
  if (config_.use_dynamic_shifting) {
    DP_CHECK(mu != nullptr, "FlowMatchEulerScheduler: mu must be given when use_dynamic_shifting is true");
    const double numerator = config_.time_shift_type == "exponential" ? std::exp(*mu) : *mu;
    for (double& t : sigmas) t = numerator / (numerator + (1.0 / t - 1.0));
  } else {
    for (double& s : sigmas) s = config_.shift * s / (1.0 + (config_.shift - 1.0) * s);
  }
  return sigmas;
}

void FlowMatchEulerScheduler::set_timesteps(int num_inference_steps, const double* mu) {
  DP_CHECK(num_inference_steps > 0, "set_timesteps: num_inference_steps must be positive, got ",
           num_inference_steps);
  // Without custom sigmas diffusers stays in float64 until the final torch conversion.
  const double train = config_.num_train_timesteps;
  std::vector<double> sigmas = numpy_linspace(static_cast<double>(sigma_max_) * train,
                                              static_cast<double>(sigma_min_) * train, num_inference_steps);
  for (double& s : sigmas) s /= train;
  sigmas = apply_shift(std::move(sigmas), mu);
  finish(std::vector<float>(sigmas.begin(), sigmas.end()));
}

void FlowMatchEulerScheduler::set_timesteps_from_sigmas(const std::vector<double>& sigmas, const double* mu) {
  DP_CHECK(!sigmas.empty(), "set_timesteps: the custom sigmas are empty");
  finish(apply_shift(std::vector<float>(sigmas.begin(), sigmas.end()), mu));
}

void FlowMatchEulerScheduler::finish(const std::vector<float>& shifted_sigmas) {
  const float train = static_cast<float>(config_.num_train_timesteps);
  sigmas_ = shifted_sigmas;
  if (config_.invert_sigmas) {
    for (float& s : sigmas_) s = 1.0f - s;
  }
  timesteps_.clear();
  for (float s : sigmas_) timesteps_.push_back(s * train);
  sigmas_.push_back(config_.invert_sigmas ? 1.0f : 0.0f);
}

at::Tensor FlowMatchEulerScheduler::step(const at::Tensor& model_output, int step_index,
                                         const at::Tensor& sample) const {
  DP_CHECK(step_index >= 0 && step_index < num_inference_steps(), "scheduler step index ", step_index,
           " is outside [0, ", num_inference_steps(), "); was set_timesteps called?");
  DP_CHECK(model_output.sizes() == sample.sizes(), "scheduler step: model output shape ", model_output.sizes(),
           " differs from the sample shape ", sample.sizes());
  const float dt = sigmas_[static_cast<size_t>(step_index) + 1] - sigmas_[static_cast<size_t>(step_index)];
  // diffusers keeps its sigmas on the sample's device: a 0-dim tensor there gives the same type promotion
  // (on CUDA the factor is rounded to the output dtype, on CPU it stays a float scalar).
  const at::Tensor dt_tensor = at::scalar_tensor(dt, at::TensorOptions().dtype(at::kFloat).device(sample.device()));
  const at::Tensor updated = sample.to(at::kFloat) + dt_tensor * model_output;
  return updated.to(model_output.scalar_type());
}

}  // namespace dp::schedulers
