#pragma once
// Subcommands register themselves here; main.cpp only builds the CLI11 app from this list.
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace dp::cli {

struct Command {
  const char* name;
  int order;  // position in --help
  // Adds the subcommand and its options to `root` and sets the callback that runs it.
  std::function<void(CLI::App& root)> install;
};

std::vector<Command>& registered_commands();

struct CommandRegistrar {
  CommandRegistrar(const char* name, int order, std::function<void(CLI::App&)> install) {
    registered_commands().push_back({name, order, std::move(install)});
  }
};

// Exit code a command callback asks main to return (0 unless the command sets it).
int& command_exit_code();

}  // namespace dp::cli
