#pragma once
// FlowMatchEulerDiscreteScheduler's scheduler_config.json (FLUX's scheduler), parsed without LibTorch so that
// the component check and `inspect` validate it too; src/schedulers runs the schedule it describes.
#include <nlohmann/json.hpp>
#include <string>

namespace dp::schedulers {

struct FlowMatchSchedulerConfig {
  int num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int base_image_seq_len = 256;
  int max_image_seq_len = 4096;
  bool invert_sigmas = false;
  std::string time_shift_type = "exponential";  // or "linear"

  // Reads scheduler/scheduler_config.json. Options this runtime does not implement (karras, exponential or
  // beta sigmas, shift_terminal, stochastic sampling) are rejected with an error naming the key.
  static FlowMatchSchedulerConfig from_file(const std::string& path);
  // The same checks on an already parsed document; `source` names the file in errors.
  static FlowMatchSchedulerConfig from_json(const nlohmann::json& config, const std::string& source);
};

}  // namespace dp::schedulers
