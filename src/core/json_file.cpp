#include "core/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"

namespace dp {
namespace {

// Error text from the parser or from a file, made printable and short: it may quote raw bytes of the file.
std::string printable(const std::string& text, std::size_t limit = 300) {
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= limit) return out + "...";
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// A JSON value as an error message shows it: compact, ASCII, cut after a few dozen characters.
std::string shown(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

std::string kind_of(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::null: return "null";
    default: return "a number";
  }
}

// nlohmann's messages start with "[json.exception.parse_error.101] parse error "; the rest (line, column,
// what was expected) is worth keeping.
std::string without_nlohmann_prefix(std::string text) {
  if (text.rfind("[json.exception.", 0) == 0) {
    const auto end = text.find("] ");
    if (end != std::string::npos) text = text.substr(end + 2);
  }
  if (text.rfind("parse error ", 0) == 0) text = text.substr(12);
  return text;
}

// Names the value being converted: "FILE: field 'KEY'" or "FILE: field 'KEY'[INDEX]".
struct Field {
  const std::string& source;
  const std::string& key;
  long index = -1;
};

std::ostream& operator<<(std::ostream& out, const Field& f) {
  out << f.source << ": field '" << f.key << "'";
  if (f.index >= 0) out << "[" << f.index << "]";
  return out;
}

template <typename T>
struct IsVector : std::false_type {};
template <typename E>
struct IsVector<std::vector<E>> : std::true_type {};

template <typename T>
const char* plural_name() {
  if constexpr (std::is_same_v<T, bool>) return "booleans";
  if constexpr (std::is_integral_v<T>) return "integers";
  if constexpr (std::is_floating_point_v<T>) return "numbers";
  return "strings";
}

template <typename T>
T value_as(const nlohmann::json& v, const Field& field) {
  if constexpr (std::is_same_v<T, bool>) {
    DP_CHECK(v.is_boolean(), field, " must be true or false, got ", shown(v));
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    constexpr auto low = std::numeric_limits<T>::min();
    constexpr auto high = std::numeric_limits<T>::max();
    DP_CHECK(v.is_number_integer(), field, " must be an integer, got ", shown(v));
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(high)
                                             : v.get<int64_t>() >= low && v.get<int64_t>() <= high;
    DP_CHECK(fits, field, " must be an integer in [", int64_t{low}, ", ", uint64_t{high}, "], got ", shown(v));
    return v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>()) : static_cast<T>(v.get<int64_t>());
  } else if constexpr (std::is_floating_point_v<T>) {
    DP_CHECK(v.is_number(), field, " must be a number, got ", shown(v));
    return v.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    DP_CHECK(v.is_string(), field, " must be a string, got ", shown(v));
    return v.get<std::string>();
  } else {
    static_assert(IsVector<T>::value, "json_get supports bool, integers, double, std::string and their vectors");
    using Element = typename T::value_type;
    DP_CHECK(v.is_array(), field, " must be a list of ", plural_name<Element>(), ", got ", shown(v));
    T out;
    out.reserve(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      out.push_back(value_as<Element>(v[i], Field{field.source, field.key, static_cast<long>(i)}));
    }
    return out;
  }
}

// Reads at most `max_bytes` + 1 bytes of an open file, so an endless device or FIFO cannot exhaust memory.
std::string read_capped(int fd, const std::string& path, uint64_t max_bytes) {
  std::string text;
  char buffer[1 << 16];
  while (text.size() <= max_bytes) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    DP_CHECK(got >= 0, path, ": read failed: ", std::strerror(errno));
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
  }
  DP_CHECK(text.size() <= max_bytes, path, ": more than ", max_bytes, " bytes; a JSON file here may be at most that");
  return text;
}

// Parses `text` with a callback that sees every key as it is read: one set of keys per open object.
nlohmann::json parse_refusing_duplicate_keys(const std::string& text, const std::string& path) {
  struct Open {
    std::string name;  // where this object is: "the top level" or "object 'KEY'"
    std::vector<std::string> keys;
  };
  std::vector<Open> open;
  std::string last_key;
  const nlohmann::json::parser_callback_t callback = [&](int, nlohmann::json::parse_event_t event,
                                                         nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      open.push_back({open.empty() ? std::string("the top-level object") : "object '" + last_key + "'", {}});
    } else if (event == Event::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == Event::key && !open.empty()) {
      last_key = parsed.get<std::string>();
      auto& keys = open.back().keys;
      DP_CHECK(std::find(keys.begin(), keys.end(), last_key) == keys.end(), path, ": key '", printable(last_key),
               "' appears twice in ", printable(open.back().name),
               " (JSON would quietly keep the last one); give each key once");
      keys.push_back(last_key);
    }
    return true;
  };
  return nlohmann::json::parse(text, callback);
}

}  // namespace

void write_json_file(const std::string& path, const nlohmann::json& doc) {
  write_file_atomically(path, doc.dump(2) + "\n");
}

nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes, DuplicateKeys duplicates) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DP_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  std::string text;
  try {
    struct stat st {};
    DP_CHECK(::fstat(fd, &st) == 0, path, ": cannot stat: ", std::strerror(errno));
    DP_CHECK(!S_ISDIR(st.st_mode), path, ": is a directory, not a JSON file");
    DP_CHECK(!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) <= max_bytes, path, ": ", st.st_size,
             " bytes; a JSON file here may be at most ", max_bytes, " bytes");
    text = read_capped(fd, path, max_bytes);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  const bool utf16 = text.size() >= 2 && ((text[0] == '\xff' && text[1] == '\xfe') || (text[0] == '\xfe' && text[1] == '\xff'));
  DP_CHECK(!utf16, path, ": not valid JSON: the file is UTF-16 (it starts with a byte-order mark); save it as UTF-8");
  try {
    return duplicates == DuplicateKeys::refuse ? parse_refusing_duplicate_keys(text, path) : nlohmann::json::parse(text);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // The parser also rejects ill-formed UTF-8 inside strings, naming the position.
    DP_FAIL(path, ": not valid JSON (", printable(without_nlohmann_prefix(e.what())), ")");
  }
}

void require_json_object(const nlohmann::json& doc, const std::string& source) {
  DP_CHECK(doc.is_object(), source, ": expected a JSON object, got ", kind_of(doc));
}

template <typename T>
T json_get(const nlohmann::json& doc, const std::string& key, const std::string& source) {
  require_json_object(doc, source);
  auto it = doc.find(key);
  DP_CHECK(it != doc.end() && !it->is_null(), source, ": missing field '", key, "'");
  return value_as<T>(*it, Field{source, key});
}

template <typename T>
T json_get_or(const nlohmann::json& doc, const std::string& key, const T& fallback, const std::string& source) {
  require_json_object(doc, source);
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return fallback;
  return value_as<T>(*it, Field{source, key});
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
