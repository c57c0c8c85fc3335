// diffpipe: run FLUX-class diffusion transformers across ranks. See --help.
#include <algorithm>
#include <iostream>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"

namespace dp::cli {

std::vector<Command>& registered_commands() {
  static std::vector<Command> commands;
  return commands;
}

int& command_exit_code() {
  static int code = 0;
  return code;
}

}  // namespace dp::cli

int main(int argc, char** argv) {
  CLI::App app{
      "diffpipe: runs diffusers-format FLUX pipelines across GPUs and machines (mpirun or SLURM), placing the\n"
      "transformer with the same device-map rules as diffusers/accelerate and keeping every stage busy."};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (logs go to stderr)")
      ->capture_default_str();
  app.parse_complete_callback([&] { dp::log::set_level(dp::log::parse_level(log_level)); });

  auto& commands = dp::cli::registered_commands();
  std::sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.order < b.order; });
  for (auto& command : commands) command.install(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dp::Error& e) {
    std::cerr << "diffpipe: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "diffpipe: error: " << e.what() << "\n";
    return 1;
  }
  return dp::cli::command_exit_code();
}
