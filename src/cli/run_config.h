#pragma once
// Run configs: `diffpipe generate --config FILE`, where FILE is a JSON object whose keys are the command's
// long flag names without the dashes ("steps", "device-map", "prompt"). The file's settings become flags
// placed ahead of the command line's own, and a flag given on the command line drops the file's value for
// it, so the command line always wins. Torch-free: it reads the command's options from CLI11, not from the
// pipeline, so a new flag is a new key without touching this file.
#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace dp::cli {

// Keys a config may hold that are not flags of the command: documentation ("description") and flags that
// other builds have (a config shared between builds should not fail on them). Those that are flags of the
// command are passed to it; the others are dropped, flags with a warning naming them.
struct ConfigExtras {
  std::set<std::string> ignored_keys{"description"};
  // --pipeline-device-map (the text encoders' and VAE's placement) is being added to generate on another
  // branch; the seed config names it, and must run on builds with and without it.
  std::set<std::string> flags_maybe_absent{"pipeline-device-map"};
  // Flags whose config values (or list items) may be JSON objects, and how such an object becomes the flag's
  // word; `where` names the file and key for errors. "lora": {"path", "scale", "name"} -> NAME=PATH:SCALE.
  std::map<std::string, std::function<std::string(const nlohmann::json& object, const std::string& where)>> object_words{
      {"lora", lora_object_word}};
  static std::string lora_object_word(const nlohmann::json& object, const std::string& where);
};

// `args` are the command's arguments after its name (no program, no command name). When they hold
// `--config FILE` (or `--config=FILE`), returns them with the file's settings inserted as flags in front;
// `--config FILE` itself stays, so the command can name the file in its messages. Otherwise returns `args`.
// Throws naming the file and the key for: a file that is not a JSON object, an unknown key (with the
// spelling it probably meant), a value of the wrong JSON type for its flag, or --config given twice.
std::vector<std::string> expand_run_config(const CLI::App& command, const std::vector<std::string>& args,
                                           const ConfigExtras& extras = {});

}  // namespace dp::cli
