// diffpipe: run FLUX-class diffusion transformers across ranks. See --help.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "cli/command.h"
#include "cli/run_config.h"
#include "core/atomic_file.h"
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

namespace {

constexpr int kUsageError = 2;

// The subcommand named on the command line: the first argument that is not an option or the value of the
// global --log-level. Empty when there is none.
std::string named_command(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--log-level") {
      ++i;
      continue;
    }
    if (!arg.empty() && arg[0] == '-') continue;
    return arg;
  }
  return {};
}

// The position of the subcommand's name in argv, or 0 when none is named.
int command_position(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--log-level") {
      ++i;
      continue;
    }
    if (argv[i] == name) return i;
  }
  return 0;
}

// argv with a run config's settings spliced in as flags (run_config.h), reversed as CLI11's parse(vector)
// wants it; empty when the command has no --config to expand.
std::vector<std::string> arguments_with_run_config(const CLI::App& app, int argc, char** argv, const std::string& named) {
  const int position = command_position(argc, argv, named);
  if (position == 0) return {};
  const std::vector<std::string> after(argv + position + 1, argv + argc);
  const auto has_config = [](const std::string& a) { return a == "--config" || a.rfind("--config=", 0) == 0; };
  if (std::none_of(after.begin(), after.end(), has_config)) return {};
  std::vector<std::string> words(argv + 1, argv + position + 1);
  const auto expanded = expand_run_config(*app.get_subcommand(named), after);
  words.insert(words.end(), expanded.begin(), expanded.end());
  std::reverse(words.begin(), words.end());
  return words;
}

// diffpipe-torch beside this executable (build tree), or in ../libexec/diffpipe (install tree).
std::string torch_binary_path() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path dir = ec ? std::filesystem::path(".") : self.parent_path();
  for (const auto& candidate : {dir / "diffpipe-torch", dir / ".." / "libexec" / "diffpipe" / "diffpipe-torch"}) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return (dir / "diffpipe-torch").string();
}

[[noreturn]] void exec_torch_binary(const std::string& command, char** argv) {
  const std::string path = torch_binary_path();
  ::execv(path.c_str(), argv);
  std::cerr << "diffpipe: error: '" << command << "' runs in " << path << ", which could not be started ("
            << std::strerror(errno) << "); build the diffpipe_torch target or reinstall diffpipe\n";
  std::exit(1);
}

}  // namespace
}  // namespace dp::cli

int main(int argc, char** argv) {
  // Ctrl-C, kill or a closed terminal during a write removes the half-written temporary (core/atomic_file.h).
  dp::install_partial_file_cleanup();
  using dp::cli::registered_commands;
  auto& commands = registered_commands();
  std::sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.order < b.order; });

  const std::string named = dp::cli::named_command(argc, argv);
  if (!named.empty()) {
    const auto found = std::find_if(commands.begin(), commands.end(), [&](const auto& c) { return named == c.name; });
    if (found == commands.end()) {
      std::string known;
      for (const auto& c : commands) known += known.empty() ? c.name : std::string(", ") + c.name;
      std::cerr << "diffpipe: error: unknown command '" << named << "' (commands: " << known
                << "; see diffpipe --help)\n";
      return dp::cli::kUsageError;
    }
    if (found->runs_in_torch_binary) dp::cli::exec_torch_binary(named, argv);
  }

  CLI::App app{
      "diffpipe: runs diffusers-format FLUX pipelines across GPUs and machines (mpirun or SLURM), placing the\n"
      "transformer with the same device-map rules as diffusers/accelerate and keeping every stage busy."};
  app.require_subcommand(1);
  // Global options may also follow the subcommand (diffpipe plan ... --log-level debug).
  app.fallthrough();
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (logs go to stderr)")
      ->capture_default_str();
  app.parse_complete_callback([&] { dp::log::set_level(dp::log::parse_level(log_level)); });
  for (auto& command : commands) command.install(app);

  try {
    auto with_config = named.empty() ? std::vector<std::string>{} : dp::cli::arguments_with_run_config(app, argc, argv, named);
    if (with_config.empty()) {
      app.parse(argc, argv);
    } else {
      app.parse(with_config);
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::bad_alloc&) {
    std::cerr << "diffpipe: error: out of memory (std::bad_alloc); a smaller request (size, batch, dtype) may fit\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "diffpipe: error: " << e.what() << "\n";
    return 1;
  }
  return dp::cli::command_exit_code();
}
