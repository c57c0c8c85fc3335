#include "tokenizers/precompiled_charsmap.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizers/unicode.h"

namespace dp::tokenizers {
namespace {

// darts-clone's unit layout (darts.h, DoubleArrayUnit).
bool has_leaf(uint32_t unit) { return (unit >> 8) & 1; }
uint32_t value_of(uint32_t unit) { return unit & ((1u << 31) - 1); }
uint32_t label_of(uint32_t unit) { return unit & ((1u << 31) | 0xFF); }
bool is_value_unit(uint32_t unit) { return (unit >> 31) != 0; }
size_t offset_of(uint32_t unit) { return static_cast<size_t>((unit >> 10) << ((unit & (1u << 9)) >> 6)); }

uint32_t read_le32(const std::string& bytes, size_t pos) {
  uint32_t value = 0;
  for (size_t i = 0; i < 4; ++i) value |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[pos + i])) << (8 * i);
  return value;
}

std::string base64_decode(const std::string& text, const std::string& source) {
  // Standard alphabet; padding optional but, when present, only at the end and only to a multiple of 4.
  size_t data_length = text.size();
  while (data_length > 0 && text.size() - data_length < 2 && text[data_length - 1] == '=') --data_length;
  const bool padded = data_length != text.size();
  DP_CHECK(!padded || text.size() % 4 == 0, source, ": base64 padding leaves a length of ", text.size(),
           ", not a multiple of 4");
  DP_CHECK(data_length % 4 != 1, source, ": base64 text of ", data_length, " characters cannot end a byte");
  std::string out;
  out.reserve(data_length / 4 * 3 + 2);
  uint32_t buffer = 0;
  int bits = 0;
  for (size_t i = 0; i < data_length; ++i) {
    const char ch = text[i];
    int value;
    if (ch >= 'A' && ch <= 'Z') value = ch - 'A';
    else if (ch >= 'a' && ch <= 'z') value = ch - 'a' + 26;
    else if (ch >= '0' && ch <= '9') value = ch - '0' + 52;
    else if (ch == '+') value = 62;
    else if (ch == '/') value = 63;
    else DP_FAIL(source, ": invalid base64 character (byte ", static_cast<int>(static_cast<unsigned char>(ch)),
                 ") at offset ", i);
    buffer = ((buffer << 6) | static_cast<uint32_t>(value)) & 0xFFFFFF;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  return out;
}

// Protobuf wire format, just enough to walk a message's fields (protobuf's encoding guide).
uint64_t read_varint(const std::string& bytes, size_t& pos, const std::string& source) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    DP_CHECK(pos < bytes.size(), source, ": truncated protobuf varint at byte ", pos);
    const auto byte = static_cast<unsigned char>(bytes[pos++]);
    // The tenth byte holds only bit 63.
    DP_CHECK(shift < 63 || byte <= 1, source, ": protobuf varint overflows 64 bits at byte ", pos - 1);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return value;
  }
  DP_FAIL(source, ": protobuf varint longer than 10 bytes at byte ", pos);
}

// The payloads of every length-delimited field numbered `field` at the top level of `message`, in file order.
// Fields inside groups (deprecated, but protobuf still parses them) are skipped, as unknown fields are.
std::vector<std::string> length_delimited_fields(const std::string& message, uint64_t field,
                                                 const std::string& source) {
  constexpr size_t kMaxGroupDepth = 100;  // protobuf's own recursion limit
  std::vector<std::string> found;
  std::vector<uint64_t> open_groups;
  size_t pos = 0;
  while (pos < message.size()) {
    const size_t key_at = pos;
    const uint64_t key = read_varint(message, pos, source);
    const uint64_t number = key >> 3;
    const auto wire_type = static_cast<int>(key & 7);
    DP_CHECK(number != 0, source, ": protobuf field number 0 at byte ", key_at);
    if (wire_type == 0) {
      read_varint(message, pos, source);
    } else if (wire_type == 1 || wire_type == 5) {
      const size_t width = wire_type == 1 ? 8 : 4;
      DP_CHECK(width <= message.size() - pos, source, ": truncated protobuf field ", number, " at byte ", key_at);
      pos += width;
    } else if (wire_type == 2) {
      const uint64_t length = read_varint(message, pos, source);
      // Compared against what is left, so a huge length cannot wrap the position around.
      DP_CHECK(length <= message.size() - pos, source, ": protobuf field ", number, " at byte ", key_at, " claims ",
               length, " bytes but ", message.size() - pos, " remain");
      if (number == field && open_groups.empty()) found.push_back(message.substr(pos, static_cast<size_t>(length)));
      pos += static_cast<size_t>(length);
    } else if (wire_type == 3) {
      DP_CHECK(open_groups.size() < kMaxGroupDepth, source, ": protobuf groups nested deeper than ", kMaxGroupDepth,
               " at byte ", key_at);
      open_groups.push_back(number);
    } else if (wire_type == 4) {
      DP_CHECK(!open_groups.empty() && open_groups.back() == number, source, ": protobuf group end for field ",
               number, " at byte ", key_at, " matches no group start");
      open_groups.pop_back();
    } else {
      DP_FAIL(source, ": invalid protobuf wire type ", wire_type, " for field ", number, " at byte ", key_at);
    }
  }
  DP_CHECK(open_groups.empty(), source, ": protobuf group for field ", open_groups.empty() ? 0 : open_groups.back(),
           " is not closed");
  return found;
}

}  // namespace

PrecompiledCharsmap PrecompiledCharsmap::from_blob(const std::string& blob, const std::string& source) {
  PrecompiledCharsmap charsmap;
  if (blob.empty()) return charsmap;
  DP_CHECK(blob.size() >= 4, source, ": precompiled charsmap of ", blob.size(), " bytes is shorter than its header");
  const uint32_t trie_bytes = read_le32(blob, 0);
  const size_t held = blob.size() - 4;
  // sentencepiece requires at least one byte of replacements after the trie, hence the strict comparison.
  DP_CHECK(trie_bytes < held, source, ": precompiled charsmap claims a trie of ", trie_bytes,
           " bytes but holds only ", held, " bytes after its header");
  DP_CHECK(trie_bytes > 0 && trie_bytes % 4 == 0, source, ": precompiled charsmap trie size ", trie_bytes,
           " is not a positive multiple of 4");
  charsmap.units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < charsmap.units_.size(); ++i) charsmap.units_[i] = read_le32(blob, 4 + 4 * i);
  charsmap.replacements_ = blob.substr(4 + trie_bytes);

  // A lookup reads a value only at `index ^ offset` of a unit it matched a byte against that has the leaf flag,
  // so checking those for every unit covers whatever a lookup can reach, from the root or not. Value units
  // (bit 31) never match a byte, and their low bits are the value, so their "leaf flag" means nothing.
  const size_t units = charsmap.units_.size();
  std::vector<size_t> nuls;  // where each replacement string ends
  for (size_t i = 0; i < charsmap.replacements_.size(); ++i) {
    if (charsmap.replacements_[i] == '\0') nuls.push_back(i);
  }
  std::vector<bool> string_checked(nuls.size(), false);
  for (size_t index = 0; index < units; ++index) {
    const uint32_t unit = charsmap.units_[index];
    if (is_value_unit(unit) || !has_leaf(unit)) continue;
    const size_t value_index = index ^ offset_of(unit);
    DP_CHECK(value_index < units, source, ": precompiled charsmap unit ", index, " points at unit ", value_index,
             " outside the trie of ", units, " units");
    const size_t start = value_of(charsmap.units_[value_index]);
    DP_CHECK(start < charsmap.replacements_.size(), source, ": precompiled charsmap unit ", value_index,
             " points at replacement offset ", start, " past the ", charsmap.replacements_.size(),
             " bytes of replacements");
    const auto nul = std::lower_bound(nuls.begin(), nuls.end(), start);
    DP_CHECK(nul != nuls.end(), source, ": precompiled charsmap replacement at offset ", start,
             " is not NUL-terminated");
    // Each string is decoded once, however many values point into it, so a hostile trie cannot make this
    // quadratic; a value inside a string must start on a character boundary.
    const auto string_index = static_cast<size_t>(nul - nuls.begin());
    if (!string_checked[string_index]) {
      const size_t string_start = string_index == 0 ? 0 : nuls[string_index - 1] + 1;
      unicode::decode_utf8(charsmap.replacements_.substr(string_start, *nul - string_start),
                           str(source, ": precompiled charsmap replacement at offset ", string_start));
      string_checked[string_index] = true;
    }
    DP_CHECK(start == *nul || (static_cast<unsigned char>(charsmap.replacements_[start]) & 0xC0) != 0x80, source,
             ": precompiled charsmap unit ", value_index, " points into the middle of a UTF-8 character at offset ",
             start);
  }
  return charsmap;
}

PrecompiledCharsmap PrecompiledCharsmap::from_base64(const std::string& text, const std::string& source) {
  return from_blob(base64_decode(text, source), source);
}

PrecompiledCharsmap PrecompiledCharsmap::from_sentencepiece_model(const std::string& model,
                                                                  const std::string& source) {
  // Repeated occurrences of a message field merge and a repeated scalar field keeps its last value, as
  // protobuf's parser (and so sentencepiece) reads them.
  std::string blob;
  for (const std::string& normalizer_spec : length_delimited_fields(model, 3, source + " normalizer_spec")) {
    const auto charsmaps = length_delimited_fields(normalizer_spec, 2, source + " normalizer_spec");
    if (!charsmaps.empty()) blob = charsmaps.back();
  }
  return from_blob(blob, source + " normalizer_spec.precompiled_charsmap");
}

bool PrecompiledCharsmap::lookup(const std::string& chunk, std::string& replacement) const {
  // darts-clone's commonPrefixSearch, stopped at the first (shortest) match.
  const size_t units = units_.size();
  if (units == 0) return false;
  size_t node = offset_of(units_[0]);
  for (const char byte : chunk) {
    const auto label = static_cast<unsigned char>(byte);
    node ^= label;
    if (node >= units) return false;
    const uint32_t unit = units_[node];
    if (label_of(unit) != label) return false;
    node ^= offset_of(unit);
    if (!has_leaf(unit)) continue;
    // Checked at load for every leaf unit; checked again so that this function stands on its own.
    if (node >= units) return false;
    const size_t start = value_of(units_[node]);
    if (start >= replacements_.size()) return false;
    const size_t end = replacements_.find('\0', start);
    if (end == std::string::npos) return false;
    replacement.assign(replacements_, start, end - start);
    return true;
  }
  return false;
}

}  // namespace dp::tokenizers
