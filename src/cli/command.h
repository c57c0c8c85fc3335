#pragma once
// Subcommands register themselves here; main.cpp only builds the CLI11 app from this list.
//
// The CLI is two executables so that plan, inspect and make-* never load LibTorch (its start-up costs about
// half a second and 500 MB): `diffpipe` holds the torch-free commands and hands the LibTorch ones
// (generate, forward) to `diffpipe-torch` by exec, with the same arguments. `diffpipe-torch` holds every
// command and can be run directly.
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace dp::cli {

struct Command {
  const char* name;
  int order;  // position in --help
  // Adds the subcommand and its options to `root` and sets the callback that runs it.
  std::function<void(CLI::App& root)> install;
  bool runs_in_torch_binary = false;  // the front registers such a command only to list it in --help
};

std::vector<Command>& registered_commands();

struct CommandRegistrar {
  CommandRegistrar(const char* name, int order, std::function<void(CLI::App&)> install,
                   bool runs_in_torch_binary = false) {
    registered_commands().push_back({name, order, std::move(install), runs_in_torch_binary});
  }
};

// One-line descriptions of the LibTorch commands, shared by their definitions and the front's --help.
inline constexpr const char* kGenerateSummary =
    "Generate images (or packed latents) from prompts with a diffusers FLUX folder, as FluxPipeline would for "
    "the same seed";
inline constexpr const char* kForwardSummary =
    "Run the FLUX transformer on seeded random inputs and time it, whole or split into stages (as ranks would "
    "split it)";

inline constexpr const char* kCalibrateSummary =
    "Time one double block, one single block, the embedders and the output layers on a device at a run's shape "
    "and microbatch sizes, for plan and generate to split the \"pipeline\" strategy by";

// Exit code a command callback asks main to return (0 unless the command sets it).
int& command_exit_code();

// Set by a command whose process holds LibTorch and CUDA state once it runs (generate). main() calls it with the
// exit status after printing the command's error, so that a failed run ends as a successful one does (MPI
// finalised, output flushed, _Exit) and not through LibTorch's and CUDA's static destructors, which crashed an
// H100 run refused by its memory caps (exit 139 instead of 3: a background thread was still pinning memory).
std::function<void(int)>& end_after_command_error();

// The text `diffpipe --version` prints. diffpipe-torch sets it (the runtime's libraries: LibTorch, CUDA, NCCL,
// MPI); the front, which links none of them, hands --version to diffpipe-torch.
std::function<std::string()>& version_text();

}  // namespace dp::cli
