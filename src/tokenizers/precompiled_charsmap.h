#pragma once
// sentencepiece's "precompiled charsmap" normalizer, the one T5 folders carry (in spiece.model's
// normalizer_spec, or base64 in tokenizer.json's Precompiled normalizer). The blob is a little-endian uint32
// trie size, a darts-clone double array of that many bytes (uint32 units), then NUL-terminated replacement
// strings that the trie's values point into.
//
// The blob comes from an untrusted file, so it is validated whole when it is read: the trie fits in the
// blob, and every value a lookup can reach points at a NUL-terminated, valid UTF-8 replacement. Lookups
// still check every index they compute, so no unit, however hostile, makes them read outside the blob.
#include <cstdint>
#include <string>
#include <vector>

namespace dp::tokenizers {

class PrecompiledCharsmap {
 public:
  // An empty charsmap: no normalization.
  PrecompiledCharsmap() = default;

  // Each throws dp::Error naming `source` (the file and the field) and what is wrong. An empty blob gives an
  // empty charsmap, as sentencepiece's identity normalizer writes.
  static PrecompiledCharsmap from_blob(const std::string& blob, const std::string& source);
  static PrecompiledCharsmap from_base64(const std::string& text, const std::string& source);
  // A serialized sentencepiece ModelProto (spiece.model): normalizer_spec (field 3).precompiled_charsmap
  // (field 2), read with a minimal protobuf wire reader.
  static PrecompiledCharsmap from_sentencepiece_model(const std::string& model, const std::string& source);

  bool empty() const { return units_.empty(); }
  // The replacement for the shortest trie key that prefixes `chunk` (what tokenizers' Precompiled uses).
  bool lookup(const std::string& chunk, std::string& replacement) const;

 private:
  std::vector<uint32_t> units_;
  std::string replacements_;
};

}  // namespace dp::tokenizers
