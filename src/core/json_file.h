#pragma once
// Reading JSON files from untrusted folders: every failure names the file.
#include <nlohmann/json.hpp>
#include <string>

namespace dp {

nlohmann::json read_json_file(const std::string& path);
// Writes `doc` indented by two spaces with a final newline, as save_pretrained does; throws naming the file.
void write_json_file(const std::string& path, const nlohmann::json& doc);

// Typed field access with errors that name the file and the key.
template <typename T>
T json_get(const nlohmann::json& doc, const std::string& key, const std::string& source);
template <typename T>
T json_get_or(const nlohmann::json& doc, const std::string& key, const T& fallback, const std::string& source);

}  // namespace dp
