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
#include "core/exit_codes.h"
#include "core/suggest.h"
#include "core/log.h"
#include "core/process_clock.h"

namespace dp::cli {

std::vector<Command>& registered_commands() {
  static std::vector<Command> commands;
  return commands;
}

int& command_exit_code() {
  static int code = 0;
  return code;
}

std::function<void(int)>& end_after_command_error() {
  static std::function<void(int)> end;
  return end;
}

std::function<std::string()>& version_text() {
  static std::function<std::string()> text;
  return text;
}

namespace {

constexpr int kUsageError = kExitUsageError;

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

// The long option names `command` (or the root, when empty) accepts, global options included, without "--".
std::vector<std::string> known_long_options(const CLI::App& app, const std::string& command) {
  std::vector<std::string> names;
  auto add = [&names](const CLI::App& from) {
    for (const auto* option : from.get_options())
      for (const auto& name : option->get_lnames()) names.push_back(name);
  };
  add(app);
  if (!command.empty()) add(*app.get_subcommand(command));
  return names;
}

// For a command line CLI11 refused: "unknown option --X (did you mean --Y?)" for every --X the command does not
// take. Empty when every --word is known (the refusal was about something else).
std::string unknown_option_message(const CLI::App& app, const std::string& command, int argc, char** argv) {
  const auto known = known_long_options(app, command);
  std::string message;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (word.size() < 3 || word.compare(0, 2, "--") != 0) continue;
    const std::string name = word.substr(2, word.find('=') == std::string::npos ? std::string::npos : word.find('=') - 2);
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    const std::string best = closest_spelling(name, known);
    message += str(message.empty() ? "" : "\n", "diffpipe", command.empty() ? "" : " " + command,
                   ": error: unknown option --", name, best.empty() ? std::string() : " (did you mean --" + best + "?)");
  }
  return message;
}

// Prints a parse error (or the help CLI11 was asked for) and returns the status: 0 for --help, else 2 for every
// kind of usage error (CLI11's own codes, 106 for a missing option or 109 for an unknown one, are not ours).
int report_parse_error(const CLI::App& app, const CLI::ParseError& e, const std::string& command, int argc,
                       char** argv) {
  if (e.get_exit_code() == 0) return app.exit(e);
  const std::string unknown =
      dynamic_cast<const CLI::ExtrasError*>(&e) ? unknown_option_message(app, command, argc, argv) : std::string();
  if (unknown.empty()) {
    app.exit(e);
  } else {
    std::cerr << unknown << "\nRun with --help for more information.\n";
  }
  return kExitUsageError;
}

// `diffpipe --version`, also after a command's name (as --log-level may be), before any "--".
bool asks_for_version(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--") return false;
    if (std::string(argv[i]) == "--version") return true;
  }
  return false;
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

// A command's error, printed: the command's own ending when it set one (end_after_command_error), else `code`.
int end_after_error(int code) {
  if (const auto& end = end_after_command_error()) end(code);
  return code;
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
  // Before anything else: how long the process took to reach main() (shared libraries, static initialisers).
  dp::mark_main_entered();
  // Ctrl-C, kill or a closed terminal during a write removes the half-written temporary (core/atomic_file.h).
  dp::install_partial_file_cleanup();
  using dp::cli::registered_commands;
  auto& commands = registered_commands();
  std::sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.order < b.order; });

  const std::string named = dp::cli::named_command(argc, argv);
  if (dp::cli::asks_for_version(argc, argv)) {
    const bool front = std::any_of(commands.begin(), commands.end(), [](const auto& c) { return c.runs_in_torch_binary; });
    if (front) dp::cli::exec_torch_binary("--version", argv);
    std::cout << dp::cli::version_text()();
    return 0;
  }
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
  app.footer(
      "Exit status (every command): 0 done; 1 runtime error (the work started and failed); 2 usage error (the\n"
      "command line cannot be parsed); 3 input error (refused before any work: a bad folder, file or value);\n"
      "75 stopped by SIGUSR1/SIGTERM after writing a checkpoint (generate --checkpoint-dir): requeue with --resume.");
  // Global options may also follow the subcommand (diffpipe plan ... --log-level debug).
  app.fallthrough();
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (logs go to stderr)")
      ->capture_default_str();
  // Answered before parsing (see main's start); declared here for --help.
  app.add_flag("--version", "print diffpipe's version and git revision, and the LibTorch, CUDA, NCCL and MPI it uses");
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
    return dp::cli::report_parse_error(app, e, named, argc, argv);
  } catch (const dp::UsageError& e) {
    std::cerr << "diffpipe: error: " << e.what() << "\n";
    return dp::cli::end_after_error(dp::kExitUsageError);
  } catch (const std::bad_alloc&) {
    std::cerr << "diffpipe: error: out of memory (std::bad_alloc); a smaller request (size, batch, dtype) may fit\n";
    return dp::cli::end_after_error(dp::failure_exit_code());
  } catch (const std::exception& e) {
    std::cerr << "diffpipe: error: " << e.what() << "\n";
    return dp::cli::end_after_error(dp::failure_exit_code());
  }
  return dp::cli::command_exit_code();
}
