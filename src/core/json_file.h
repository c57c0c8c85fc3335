#pragma once
// Reading JSON files from untrusted folders: every failure names the file, and typed field access is exact
// (an integer field refuses 2.7 and true, a bool field refuses 0 and 1, a string field refuses numbers), so a
// config is read the way Python would read it or not at all. No message carries nlohmann's own wording.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace dp {

// The largest JSON file read_json_file accepts: configs are kilobytes and tokenizer.json a few megabytes, so
// anything near this is not what it claims to be, and parsing it would cost seconds and gigabytes.
constexpr uint64_t kMaxJsonFileBytes = uint64_t{64} << 20;

// What a key named twice in one object means. Files diffusers writes keep JSON's (and Python's) rule, the last
// one wins; files a user writes for diffpipe (run configs, max-memory maps) refuse it, since a config that says
// two things must not quietly mean one.
enum class DuplicateKeys { last_wins, refuse };

// Reads and parses a UTF-8 JSON file; throws naming the file when it is missing, unreadable, a directory,
// larger than `max_bytes`, or not valid JSON (with the line and column), and with DuplicateKeys::refuse when
// an object names a key twice (naming the key and where it is).
nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes = kMaxJsonFileBytes,
                              DuplicateKeys duplicates = DuplicateKeys::last_wins);
// Writes `doc` indented by two spaces with a final newline, as save_pretrained does; throws naming the file.
void write_json_file(const std::string& path, const nlohmann::json& doc);

// Throws "`source`: expected a JSON object, got an array" unless `doc` is an object: a config.json must be one.
void require_json_object(const nlohmann::json& doc, const std::string& source);

// Typed field access with errors that name the file (`source`) and the key, and for lists the index.
// Supported T: bool, int, int64_t, double (any JSON number), std::string, and std::vector of int, int64_t,
// double, std::string. Integers must be JSON integers within T's range.
template <typename T>
T json_get(const nlohmann::json& doc, const std::string& key, const std::string& source);
// json_get, or `fallback` when the key is absent or null (diffusers writes null for "use the default").
// `doc` must still be an object.
template <typename T>
T json_get_or(const nlohmann::json& doc, const std::string& key, const T& fallback, const std::string& source);

}  // namespace dp
