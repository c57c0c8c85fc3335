#pragma once
// plan's checks and inputs: every option checked and turned into the placement::PlanRequest (and, for --simulate
// and --simulate-sweep, the simulation options) before a header is read; the calibration the stage times come
// from, and with --simulate --prompts the microbatch size that simulates fastest.
#include <nlohmann/json.hpp>

#include "cli/plan_options.h"

namespace dp::cli {

// Where the plan's times come from; both go into the plan's output.
struct PlanTimes {
  nlohmann::ordered_json calibration;        // {"used": bool, "message": ...} and, when used, the file and device
  nlohmann::ordered_json microbatch_choice;  // null unless the microbatch size was chosen by simulation
};

// Resolves --model, checks the options and fills o.request and o.simulation from them.
PlanTimes prepare_plan_request(PlanOptions& o);

}  // namespace dp::cli
