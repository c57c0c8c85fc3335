#include "tokenizers/tokenizer_files.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "core/json_file.h"

namespace dp::tokenizers::files {

nlohmann::json read_object(const std::string& path) {
  nlohmann::json doc = with_file(path, [&] { return read_json_file(path); });
  DP_CHECK(doc.is_object(), path, ": expected a JSON object at the top level, got ", describe(doc));
  return doc;
}

std::string quoted(const std::string& text) {
  constexpr size_t kShown = 60;
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kShown; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x20 || byte == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02X", byte);
      out += escaped;
    } else {
      out += static_cast<char>(byte);
    }
  }
  out += text.size() > kShown ? "'..." : "'";
  return out;
}

std::string describe(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object: return str("an object of ", value.size(), " members");
    case nlohmann::json::value_t::array: return str("an array of ", value.size(), " elements");
    case nlohmann::json::value_t::string: return "the string " + quoted(value.get_ref<const std::string&>());
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return value.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::number_float: return str("the number ", value.dump());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return str("the integer ", value.dump());
    default: return "a binary value";
  }
}

const nlohmann::json* member(const nlohmann::json& object, const std::string& key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

const nlohmann::json& tokenizer_model(const nlohmann::json& doc, const std::string& path, const std::string& type,
                                      const std::string& for_whom) {
  const nlohmann::json* model = member(doc, "model");
  DP_CHECK(model != nullptr, path, ": missing field 'model'");
  as_object(*model, path, "model");
  const nlohmann::json* found = member(*model, "type");
  DP_CHECK(found != nullptr && found->is_string() && found->get_ref<const std::string&>() == type, path,
           ": expected a ", type, " model", for_whom, ", model.type is ", found == nullptr ? "missing" : describe(*found));
  DP_CHECK(member(*model, "vocab") != nullptr, path, ": missing field 'model.vocab'");
  return *model;
}

const std::string& as_string(const nlohmann::json& value, const std::string& path, const std::string& field) {
  DP_CHECK(value.is_string(), path, ": ", field, " must be a string, got ", describe(value));
  return value.get_ref<const std::string&>();
}

const std::string& as_nonempty_string(const nlohmann::json& value, const std::string& path,
                                      const std::string& field) {
  const std::string& text = as_string(value, path, field);
  DP_CHECK(!text.empty(), path, ": ", field, " must not be empty");
  return text;
}

int64_t as_integer(const nlohmann::json& value, int64_t min, int64_t max, const std::string& path,
                   const std::string& field) {
  DP_CHECK(value.is_number_integer(), path, ": ", field, " must be an integer, got ", describe(value));
  // Non-negative JSON integers are held unsigned; those above int64's range would wrap in get<int64_t>().
  bool in_range;
  if (value.is_number_unsigned()) {
    const uint64_t number = value.get<uint64_t>();
    in_range = max >= 0 && number <= static_cast<uint64_t>(max) && (min <= 0 || number >= static_cast<uint64_t>(min));
  } else {
    const int64_t number = value.get<int64_t>();
    in_range = number >= min && number <= max;
  }
  DP_CHECK(in_range, path, ": ", field, " is ", value.dump(), ", outside [", min, ", ", max, "]");
  return value.get<int64_t>();
}

double as_finite_number(const nlohmann::json& value, const std::string& path, const std::string& field) {
  DP_CHECK(value.is_number(), path, ": ", field, " must be a number, got ", describe(value));
  const double number = value.get<double>();
  DP_CHECK(std::isfinite(number), path, ": ", field, " must be finite, got ", value.dump());
  return number;
}

bool as_bool(const nlohmann::json& value, const std::string& path, const std::string& field) {
  DP_CHECK(value.is_boolean(), path, ": ", field, " must be true or false, got ", describe(value));
  return value.get<bool>();
}

const nlohmann::json& as_object(const nlohmann::json& value, const std::string& path, const std::string& field) {
  DP_CHECK(value.is_object(), path, ": ", field, " must be an object, got ", describe(value));
  return value;
}

const nlohmann::json& as_array(const nlohmann::json& value, const std::string& path, const std::string& field) {
  DP_CHECK(value.is_array(), path, ": ", field, " must be an array, got ", describe(value));
  return value;
}

int64_t parse_integer(const std::string& text, int64_t min, int64_t max, const std::string& path,
                      const std::string& field) {
  // Digits only (no sign, spaces or "0x"), at most 18 of them so the sum cannot overflow; std::stoll's
  // exceptions named neither the file nor the text.
  bool valid = !text.empty() && text.size() <= 18;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') valid = false;
    if (valid) value = value * 10 + (c - '0');
  }
  DP_CHECK(valid, path, ": ", field, " ", quoted(text), " is not a non-negative decimal integer");
  DP_CHECK(value >= min && value <= max, path, ": ", field, " ", text, " is outside [", min, ", ", max, "]");
  return value;
}

std::string token_content(const nlohmann::json& token, const std::string& path, const std::string& field) {
  if (token.is_string()) return as_nonempty_string(token, path, field);
  DP_CHECK(token.is_object(), path, ": ", field, " must be a string or an object with a 'content' string, got ",
           describe(token));
  const nlohmann::json* content = member(token, "content");
  DP_CHECK(content != nullptr, path, ": ", field, " has no 'content'");
  return as_nonempty_string(*content, path, field + ".content");
}

bool token_normalized(const nlohmann::json& token, bool fallback, const std::string& path, const std::string& field) {
  if (!token.is_object()) return fallback;
  const nlohmann::json* normalized = member(token, "normalized");
  return normalized == nullptr ? fallback : as_bool(*normalized, path, field + ".normalized");
}

std::vector<AddedToken> added_tokens(const nlohmann::json& doc, int64_t vocab_size, const std::string& path) {
  std::vector<AddedToken> entries;
  const nlohmann::json* added_tokens = member(doc, "added_tokens");
  if (added_tokens == nullptr) return entries;
  as_array(*added_tokens, path, "added_tokens");
  for (size_t i = 0; i < added_tokens->size(); ++i) {
    const std::string field = str("added_tokens[", i, "]");
    const nlohmann::json& added = as_object((*added_tokens)[i], path, field);
    const nlohmann::json* id = member(added, "id");
    DP_CHECK(id != nullptr, path, ": ", field, " has no 'id'");
    entries.push_back({token_content(added, path, field), as_integer(*id, 0, vocab_size - 1, path, field + ".id"),
                       token_normalized(added, false, path, field)});
  }
  return entries;
}

int model_max_length(const nlohmann::json& config, int fallback, int minimum, const std::string& path) {
  const nlohmann::json* value = member(config, "model_max_length");
  if (value == nullptr) return fallback;
  DP_CHECK(value->is_number(), path, ": model_max_length must be a number, got ", describe(*value));
  // transformers writes int(1e30), which JSON readers hold as a float, for "no limit".
  if (value->get<double>() > 1e9) return fallback;
  return static_cast<int>(as_integer(*value, minimum, kMaxModelMaxLength, path, "model_max_length"));
}

}  // namespace dp::tokenizers::files
