#pragma once
// plan's text output: where the times came from, the hf_device_map with runs of blocks on one device grouped, the
// ranks and ring the map needs, the devices table, the predicted stage times next to "balanced" and "pipeline",
// and the simulations when asked for.
#include <nlohmann/json.hpp>

namespace dp::cli {

// Prints `plan`, the object `plan --json` prints, as text.
void print_plan_text(const nlohmann::ordered_json& plan);

}  // namespace dp::cli
