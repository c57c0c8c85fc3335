#pragma once
// The T5 tokenizer of FLUX's tokenizer_2 folder, as transformers 5 builds T5TokenizerFast: special tokens
// split out first, the sentencepiece "precompiled charsmap" normalizer (applied per grapheme, as tokenizers
// does), whitespace split, the Metaspace "▁" prefix on every word, Unigram Viterbi with fused unknowns, then
// "</s>". Reads tokenizer.json when present (transformers prefers it), else spiece.model via sentencepiece.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizers/added_tokens.h"
#include "tokenizers/precompiled_charsmap.h"

namespace dp::tokenizers {

class T5Tokenizer {
 public:
  // Throws dp::Error naming the folder, or the malformed file and field; every file is checked whole here.
  static T5Tokenizer from_folder(const std::string& folder);

  // All ids of the text followed by eos; no truncation or padding (padding="longest" for one prompt).
  std::vector<int64_t> encode(const std::string& text) const;
  // FluxPipeline's call: truncation=True (eos stays last), padding="max_length". A truncated prompt logs a
  // warning naming the removed text.
  std::vector<int64_t> encode_padded(const std::string& text, int max_length) const;
  // Pieces joined with "▁" read as a space, the leading space dropped (tokenizers' Metaspace decoder).
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  int model_max_length() const { return model_max_length_; }

 private:
  struct Piece {
    std::string text;
    double score = 0.0;
  };
  void read_tokenizer_json(const std::string& path);
  void read_spiece_model(const std::string& path);
  void finish_loading(const std::string& folder, const std::string& config_path);
  std::string normalize(const std::string& text) const;
  void encode_word(const std::string& word, std::vector<int64_t>& ids) const;
  void encode_segment(const std::string& segment, std::vector<int64_t>& ids) const;

  std::vector<Piece> pieces_;
  std::unordered_map<std::string, int64_t> piece_ids_;
  std::vector<RawAddedToken> added_tokens_;  // matched in the raw text before anything else
  PrecompiledCharsmap charsmap_;             // sentencepiece's normalizer (may be empty)
  size_t longest_piece_bytes_ = 0;
  double unknown_score_ = 0.0;
  int64_t unk_id_ = 2, eos_id_ = 1, pad_id_ = 0;
  int model_max_length_ = 512;
};

}  // namespace dp::tokenizers
