// The front executable's entries for the commands that need LibTorch: listed in `diffpipe --help`, run by
// diffpipe-torch (main.cpp execs it before parsing when one of them is named).
#include "cli/command.h"

namespace dp::cli {
namespace {

void list_only(CLI::App& root, const char* name, const char* summary) {
  root.add_subcommand(name, summary)->allow_extras();
}

CommandRegistrar generate("generate", 10, [](CLI::App& root) { list_only(root, "generate", kGenerateSummary); },
                          /*runs_in_torch_binary=*/true);
CommandRegistrar calibrate("calibrate", 45, [](CLI::App& root) { list_only(root, "calibrate", kCalibrateSummary); },
                           /*runs_in_torch_binary=*/true);
CommandRegistrar forward("forward", 40, [](CLI::App& root) { list_only(root, "forward", kForwardSummary); },
                         /*runs_in_torch_binary=*/true);

}  // namespace
}  // namespace dp::cli
