#pragma once
// Checked reading of tokenizer files (vocab.json, merges.txt, tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, spiece.model). They come from folders we do not control, so each value is checked
// for type and range before use, and each failure is a one-line dp::Error naming the file and the field.
// nlohmann's own exceptions never reach the caller: they name no file and, for a const lookup of a
// missing key, do not even throw.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizers/added_tokens.h"

namespace dp::tokenizers::files {

// A limit no real tokenizer config comes near (CLIP says 77, T5 512) that keeps a padded encoding of a
// hostile config from asking for gigabytes. transformers' "no limit" (int(1e30)) is read as unset.
constexpr int64_t kMaxModelMaxLength = int64_t{1} << 20;

// Reads a JSON file whose top level must be an object.
nlohmann::json read_object(const std::string& path);

// A value for a message: its type, and for scalars the value itself, shortened. Never dumps a container,
// which could be huge or nested deeply enough to exhaust the stack.
std::string describe(const nlohmann::json& value);
// Text from a file for a message: quoted, control bytes escaped, long text cut.
std::string quoted(const std::string& text);

// The member `key` of `object`, or nullptr when it is absent or null. `object` must be an object.
const nlohmann::json* member(const nlohmann::json& object, const std::string& key);

// tokenizer.json's "model" object, whose "type" must be `type` (BPE, Unigram) and which must have a "vocab";
// `for_whom` ends the type's message (" for T5").
const nlohmann::json& tokenizer_model(const nlohmann::json& doc, const std::string& path, const std::string& type,
                                      const std::string& for_whom = "");
// Typed views of a value; `field` names it in messages (e.g. "added_tokens[3].id").
const std::string& as_string(const nlohmann::json& value, const std::string& path, const std::string& field);
const std::string& as_nonempty_string(const nlohmann::json& value, const std::string& path,
                                      const std::string& field);
// An integer in [min, max]; a float such as 2.0 or 2.7 is refused.
int64_t as_integer(const nlohmann::json& value, int64_t min, int64_t max, const std::string& path,
                   const std::string& field);
double as_finite_number(const nlohmann::json& value, const std::string& path, const std::string& field);
bool as_bool(const nlohmann::json& value, const std::string& path, const std::string& field);
const nlohmann::json& as_object(const nlohmann::json& value, const std::string& path, const std::string& field);
const nlohmann::json& as_array(const nlohmann::json& value, const std::string& path, const std::string& field);
// A decimal integer written as text (added_tokens_decoder's keys), in [min, max].
int64_t parse_integer(const std::string& text, int64_t min, int64_t max, const std::string& path,
                      const std::string& field);

// The same checks for loops over tens of thousands of entries (vocabularies, merges): `field()` builds the
// entry's name only when the entry is wrong; building it for every entry cost more than parsing the file.
template <typename FieldName>
const std::string& as_string_of(const nlohmann::json& value, const std::string& path, FieldName&& field) {
  return value.is_string() ? value.get_ref<const std::string&>() : as_string(value, path, field());
}
template <typename FieldName>
int64_t as_integer_of(const nlohmann::json& value, int64_t min, int64_t max, const std::string& path,
                      FieldName&& field) {
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    const int64_t number = value.get<int64_t>();
    if (number >= min && number <= max) return number;
  } else if (value.is_number_unsigned() && max >= 0) {
    const uint64_t number = value.get<uint64_t>();
    if (number <= static_cast<uint64_t>(max) && (min <= 0 || number >= static_cast<uint64_t>(min)))
      return static_cast<int64_t>(number);
  }
  return as_integer(value, min, max, path, field());
}
template <typename FieldName>
double as_finite_number_of(const nlohmann::json& value, const std::string& path, FieldName&& field) {
  if (value.is_number()) {
    const double number = value.get<double>();
    if (std::isfinite(number)) return number;
  }
  return as_finite_number(value, path, field());
}

// A special token as transformers writes it: a string, or an AddedToken object with a "content" string.
// The content must not be empty (an empty token would match everywhere without advancing).
std::string token_content(const nlohmann::json& token, const std::string& path, const std::string& field);
// An AddedToken object's "normalized" flag, `fallback` when absent or when the token is a plain string.
bool token_normalized(const nlohmann::json& token, bool fallback, const std::string& path, const std::string& field);

// tokenizer.json's "added_tokens" (none when absent), each id checked to lie in [0, vocab_size), "normalized"
// false when absent.
std::vector<AddedToken> added_tokens(const nlohmann::json& doc, int64_t vocab_size, const std::string& path);

// tokenizer_config.json's model_max_length: `fallback` when absent or "no limit" (above 1e9, as transformers
// writes it), otherwise an integer in [minimum, kMaxModelMaxLength].
int model_max_length(const nlohmann::json& config, int fallback, int minimum, const std::string& path);

// Runs `read` and turns anything other than a dp::Error (nlohmann, std::bad_alloc, the standard library)
// into one naming `path`, so the loaders keep a final net under their explicit checks.
template <typename Read>
auto with_file(const std::string& path, Read&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const dp::Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    DP_FAIL(path, ": out of memory while reading it (is a size in the file absurd?)");
  } catch (const std::exception& e) {
    DP_FAIL(path, ": cannot read it: ", e.what());
  }
}

}  // namespace dp::tokenizers::files
