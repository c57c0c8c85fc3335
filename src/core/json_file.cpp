#include "core/json_file.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"

namespace dp {

void write_json_file(const std::string& path, const nlohmann::json& doc) {
  write_file_atomically(path, doc.dump(2) + "\n");
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DP_CHECK(in.good(), path, ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    DP_FAIL(path, ": not valid JSON: ", e.what());
  }
}

template <typename T>
T json_get(const nlohmann::json& doc, const std::string& key, const std::string& source) {
  DP_CHECK(doc.is_object(), source, ": expected a JSON object");
  auto it = doc.find(key);
  DP_CHECK(it != doc.end() && !it->is_null(), source, ": missing field '", key, "'");
  try {
    return it->get<T>();
  } catch (const std::exception& e) {
    DP_FAIL(source, ": field '", key, "' has the wrong type (", it->dump(), "): ", e.what());
  }
}

template <typename T>
T json_get_or(const nlohmann::json& doc, const std::string& key, const T& fallback, const std::string& source) {
  if (!doc.is_object() || !doc.contains(key) || doc[key].is_null()) return fallback;
  return json_get<T>(doc, key, source);
}

#define DP_JSON_INSTANTIATE(T)                                                                   \
  template T json_get<T>(const nlohmann::json&, const std::string&, const std::string&);         \
  template T json_get_or<T>(const nlohmann::json&, const std::string&, const T&, const std::string&);
DP_JSON_INSTANTIATE(bool)
DP_JSON_INSTANTIATE(int)
DP_JSON_INSTANTIATE(int64_t)
DP_JSON_INSTANTIATE(double)
DP_JSON_INSTANTIATE(std::string)
DP_JSON_INSTANTIATE(std::vector<int>)
DP_JSON_INSTANTIATE(std::vector<int64_t>)
DP_JSON_INSTANTIATE(std::vector<double>)
DP_JSON_INSTANTIATE(std::vector<std::string>)
#undef DP_JSON_INSTANTIATE

}  // namespace dp
