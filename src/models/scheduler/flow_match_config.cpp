#include "models/scheduler/flow_match_config.h"

#include "core/error.h"
#include "core/json_file.h"

namespace dp::schedulers {

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::from_file(const std::string& path) {
  return from_json(read_json_file(path), path);
}

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::from_json(const nlohmann::json& doc, const std::string& source) {
  require_json_object(doc, source);
  const std::string class_name = json_get_or<std::string>(doc, "_class_name", "FlowMatchEulerDiscreteScheduler", source);
  DP_CHECK(class_name == "FlowMatchEulerDiscreteScheduler", source, ": _class_name '", class_name,
           "' is not FlowMatchEulerDiscreteScheduler");
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling",
                          "use_flow_sigmas"}) {
    DP_CHECK(!json_get_or<bool>(doc, key, false, source), source, ": scheduler option '", key,
             "' = true is not supported");
  }
  DP_CHECK(!doc.contains("shift_terminal") || doc["shift_terminal"].is_null(), source,
           ": scheduler option 'shift_terminal' = ", doc["shift_terminal"].dump(), " is not supported");

  FlowMatchSchedulerConfig config;
  config.num_train_timesteps = json_get_or<int>(doc, "num_train_timesteps", config.num_train_timesteps, source);
  config.shift = json_get_or<double>(doc, "shift", config.shift, source);
  config.use_dynamic_shifting = json_get_or<bool>(doc, "use_dynamic_shifting", config.use_dynamic_shifting, source);
  config.base_shift = json_get_or<double>(doc, "base_shift", config.base_shift, source);
  config.max_shift = json_get_or<double>(doc, "max_shift", config.max_shift, source);
  config.base_image_seq_len = json_get_or<int>(doc, "base_image_seq_len", config.base_image_seq_len, source);
  config.max_image_seq_len = json_get_or<int>(doc, "max_image_seq_len", config.max_image_seq_len, source);
  config.invert_sigmas = json_get_or<bool>(doc, "invert_sigmas", config.invert_sigmas, source);
  config.time_shift_type = json_get_or<std::string>(doc, "time_shift_type", config.time_shift_type, source);
  DP_CHECK(config.time_shift_type == "exponential" || config.time_shift_type == "linear", source,
           ": time_shift_type '", config.time_shift_type, "' must be 'exponential' or 'linear'");
  DP_CHECK(config.num_train_timesteps > 0, source, ": num_train_timesteps must be positive, got ",
           config.num_train_timesteps);
  if (config.use_dynamic_shifting) {
    // FluxPipeline's calculate_shift divides by their difference.
    DP_CHECK(config.max_image_seq_len != config.base_image_seq_len, source,
             ": max_image_seq_len must differ from base_image_seq_len (", config.base_image_seq_len,
             ") when use_dynamic_shifting is true");
  } else {
    // The static shift maps sigma to shift * s / (1 + (shift - 1) * s), which needs shift > 0.
    DP_CHECK(config.shift > 0, source, ": shift must be positive, got ", config.shift);
  }
  return config;
}

}  // namespace dp::schedulers
