#pragma once
// The CLIP BPE tokenizer of FLUX's tokenizer folder, as transformers 5 builds CLIPTokenizer (tokenizers
// backend): special tokens split out, NFC + whitespace runs to one space + lowercase, CLIP's regex
// pre-tokenization, GPT-2 byte-to-unicode mapping, BPE with "</w>" on each word's last symbol, then
// bos ... eos. Reads vocab.json + merges.txt (or tokenizer.json's model) and tokenizer_config.json.
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizers/added_tokens.h"

namespace dp::tokenizers {

class ClipTokenizer {
 public:
  // Throws dp::Error naming the folder, or the malformed file and field; every file is checked whole here.
  static ClipTokenizer from_folder(const std::string& folder);

  // bos, the text's ids, eos; no truncation or padding (what padding="longest" gives for one prompt).
  std::vector<int64_t> encode(const std::string& text) const;
  // FluxPipeline's call: truncation=True (bos and eos kept), padding="max_length" with the pad id. A
  // truncated prompt logs a warning naming the removed text, as diffusers does.
  std::vector<int64_t> encode_padded(const std::string& text, int max_length) const;
  std::vector<int64_t> encode_padded(const std::string& text) const { return encode_padded(text, model_max_length_); }
  // Byte-level decode with "</w>" read as a space, trimmed (transformers' CLIP decode).
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int model_max_length() const { return model_max_length_; }
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }

 private:
  void read_vocab(const nlohmann::json& vocab, const std::string& path, const std::string& field);
  std::vector<std::pair<std::string, std::string>> read_tokenizer_json(const std::string& path);
  void load_config(const std::string& folder);
  void encode_plain(const std::string& text, std::vector<int64_t>& ids) const;
  void encode_normalized(const std::u32string& text, std::vector<int64_t>& ids) const;
  void encode_piece(const std::u32string& piece, std::vector<int64_t>& ids) const;
  int64_t token_id(const std::string& token, const std::string& what) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::map<std::pair<int64_t, int64_t>, std::pair<int, int64_t>> merges_;  // pair -> (rank, merged id)
  std::vector<AddedToken> added_tokens_;
  std::vector<RawAddedToken> raw_added_tokens_;  // those of added_tokens_ with normalized false, in its order
  int64_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
  int model_max_length_ = 77;
};

}  // namespace dp::tokenizers
