#include "cli/run_config.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "core/suggest.h"

namespace dp::cli {
namespace {

enum class ValueKind { integer, unsigned_integer, number, text, flag };

struct FlagSpec {
  std::string long_name;  // without dashes
  ValueKind kind = ValueKind::text;
  bool takes_list = false;                 // repeatable (--prompt a --prompt b): a JSON array in the config
  std::vector<std::string> spellings;      // every way the command line may name it (--x, -x)
};

// CLI11 names an option's C++ type: INT, UINT, FLOAT, TEXT, with validators after a colon.
ValueKind kind_of(const CLI::Option& option) {
  if (option.get_expected_max() == 0) return ValueKind::flag;  // takes no value
  std::string type = option.get_type_name();
  type = type.substr(0, type.find(':'));
  if (type == "INT") return ValueKind::integer;
  if (type == "UINT") return ValueKind::unsigned_integer;
  if (type == "FLOAT") return ValueKind::number;
  return ValueKind::text;
}

std::map<std::string, FlagSpec> flags_of(const CLI::App& command) {
  std::map<std::string, FlagSpec> flags;
  for (const CLI::Option* option : command.get_options()) {
    if (option->get_lnames().empty()) continue;  // positional catch-alls take no key
    FlagSpec spec;
    spec.long_name = option->get_lnames().front();
    if (spec.long_name == "help" || spec.long_name == "config") continue;
    spec.kind = kind_of(*option);
    spec.takes_list = option->get_items_expected_max() > 1;
    for (const auto& l : option->get_lnames()) spec.spellings.push_back("--" + l);
    for (const auto& s : option->get_snames()) spec.spellings.push_back("-" + s);
    flags.emplace(spec.long_name, spec);
  }
  return flags;
}

const char* kind_phrase(ValueKind kind, bool list) {
  switch (kind) {
    case ValueKind::integer: return list ? "an integer or an array of integers" : "an integer";
    case ValueKind::unsigned_integer: return list ? "a non-negative integer or an array of them" : "a non-negative integer";
    case ValueKind::number: return list ? "a number or an array of numbers" : "a number";
    case ValueKind::flag: return "true or false";
    case ValueKind::text: break;
  }
  return list ? "a string or an array of strings" : "a string";
}

const char* json_type_phrase(const nlohmann::json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a non-integer number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "an array";
  return "an object";
}

// One JSON scalar as the command-line word CLI11 will convert; empty when its type is wrong for `kind`.
std::optional<std::string> scalar_word(const nlohmann::json& value, ValueKind kind) {
  switch (kind) {
    case ValueKind::integer:
      if (value.is_number_integer()) return value.dump();
      break;
    case ValueKind::unsigned_integer:
      if (value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0)) return value.dump();
      break;
    case ValueKind::number:
      // dump() writes the shortest text that reads back as the same double.
      if (value.is_number() && std::isfinite(value.get<double>())) return value.dump();
      break;
    case ValueKind::text:
      if (value.is_string()) return value.get<std::string>();
      break;
    case ValueKind::flag:
      break;
  }
  return std::nullopt;
}

// The key a misspelt one probably meant: device_map -> device-map, Steps -> steps, stpes -> steps.
std::string likely_key(const std::string& key, const std::map<std::string, FlagSpec>& flags,
                       const ConfigExtras& extras) {
  std::vector<std::string> names;
  for (const auto& [name, spec] : flags) names.push_back(name);
  names.insert(names.end(), extras.ignored_keys.begin(), extras.ignored_keys.end());
  return closest_spelling(key, names);
}

std::string known_keys(const std::map<std::string, FlagSpec>& flags, const ConfigExtras& extras) {
  std::string all;
  for (const auto& [name, spec] : flags) all += (all.empty() ? "" : ", ") + name;
  for (const auto& name : extras.ignored_keys) all += ", " + name;
  return all;
}

// The flag `arg` sets when it is one of `spec`'s spellings, alone or as --name=value.
bool names_flag(const std::string& arg, const FlagSpec& spec) {
  for (const auto& s : spec.spellings) {
    if (arg == s) return true;
    if (s.size() > 2 && arg.rfind(s + "=", 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::string ConfigExtras::lora_object_word(const nlohmann::json& object, const std::string& where) {
  for (const auto& [key, value] : object.items())
    DP_CHECK(key == "path" || key == "scale" || key == "name", where, ": unknown field '", key,
             "' (a LoRA adapter is {\"path\": FILE, \"scale\": NUMBER, \"name\": NAME}; scale and name optional)");
  DP_CHECK(object.contains("path") && object["path"].is_string() && !object["path"].get<std::string>().empty(), where,
           ": a LoRA adapter needs \"path\", the adapter's .safetensors file");
  std::string word;
  if (object.contains("name")) {
    DP_CHECK(object["name"].is_string(), where, ": \"name\" must be a string");
    word = object["name"].get<std::string>() + "=";
  }
  word += object["path"].get<std::string>();
  if (object.contains("scale")) {
    DP_CHECK(object["scale"].is_number() && std::isfinite(object["scale"].get<double>()), where,
             ": \"scale\" must be a finite number");
    word += ":" + object["scale"].dump();
  }
  return word;
}

std::vector<std::string> expand_run_config(const CLI::App& command, const std::vector<std::string>& args,
                                           const ConfigExtras& extras) {
  std::string path;
  size_t config_count = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") break;  // words after -- are values, never flags
    if (args[i] == "--config") {
      DP_CHECK(i + 1 < args.size(), "--config needs a file (a JSON run config, see configs/)");
      path = args[i + 1];
      ++config_count;
      ++i;
    } else if (args[i].rfind("--config=", 0) == 0) {
      path = args[i].substr(9);
      ++config_count;
    }
  }
  if (config_count == 0) return args;
  DP_CHECK(config_count == 1, "--config is given ", config_count, " times; give one run config (flags on the ",
           "command line override its keys)");
  DP_CHECK(!path.empty(), "--config needs a file (a JSON run config, see configs/)");

  // Duplicate keys are refused: with JSON's "last one wins" a config could say two things and mean one.
  const nlohmann::json doc = read_json_file(path, kMaxJsonFileBytes, DuplicateKeys::refuse);
  require_json_object(doc, path);
  const auto flags = flags_of(command);
  const std::string command_name = command.get_name();

  std::vector<std::string> from_config;
  for (const auto& [key, value] : doc.items()) {
    const auto found = flags.find(key);
    if (found == flags.end()) {
      if (extras.ignored_keys.count(key) != 0) continue;
      if (extras.flags_maybe_absent.count(key) != 0) {
        DP_WARN(path, ": key '", key, "' is not a flag of this build's ", command_name, "; ignoring it");
        continue;
      }
      const std::string meant = likely_key(key, flags, extras);
      DP_FAIL(path, ": unknown key '", key, "'",
              meant.empty() ? std::string() : " (did you mean '" + meant + "'? keys are the long flag names)",
              "; ", command_name, " takes: ", known_keys(flags, extras));
    }
    const FlagSpec& spec = found->second;
    const bool on_command_line = std::any_of(args.begin(), args.end(), [&](const auto& a) { return names_flag(a, spec); });
    if (on_command_line) continue;  // the command line wins, whole lists included

    const std::string flag = "--" + spec.long_name;
    if (spec.kind == ValueKind::flag) {
      DP_CHECK(value.is_boolean(), path, ": key '", key, "': expected true or false, got ", json_type_phrase(value));
      if (value.get<bool>()) from_config.push_back(flag);
      continue;
    }
    const auto object_word = extras.object_words.find(key);
    const auto word_of = [&](const nlohmann::json& item, const std::string& where) -> std::optional<std::string> {
      if (item.is_object() && object_word != extras.object_words.end()) return object_word->second(item, where);
      return scalar_word(item, spec.kind);
    };
    if (spec.takes_list && value.is_array()) {
      DP_CHECK(!value.empty(), path, ": key '", key, "': an empty array; leave the key out instead");
      for (size_t i = 0; i < value.size(); ++i) {
        const auto word = word_of(value[i], str(path, ": key '", key, "' item ", i));
        DP_CHECK(word.has_value(), path, ": key '", key, "' item ", i, ": expected ", kind_phrase(spec.kind, false),
                 ", got ", json_type_phrase(value[i]));
        from_config.push_back(flag + "=" + *word);
      }
      continue;
    }
    const auto word = word_of(value, str(path, ": key '", key, "'"));
    DP_CHECK(word.has_value(), path, ": key '", key, "': expected ", kind_phrase(spec.kind, spec.takes_list), ", got ",
             json_type_phrase(value));
    // --name=value, so that a value starting with a dash is never read as a flag.
    from_config.push_back(flag + "=" + *word);
  }
  DP_DEBUG(path, ": ", from_config.size(), " word(s) of flags from the run config");
  std::vector<std::string> expanded = from_config;
  expanded.insert(expanded.end(), args.begin(), args.end());
  return expanded;
}

}  // namespace dp::cli
