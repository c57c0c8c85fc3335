#include "tokenizers/clip_tokenizer.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "tokenizers/tokenizer_files.h"
#include "tokenizers/unicode.h"

namespace dp::tokenizers {
namespace {

namespace fs = std::filesystem;
const std::string kEndOfWord = "</w>";

// GPT-2's reversible byte -> printable code point map: printable Latin-1 bytes map to themselves, the
// others to 256, 257, ... in byte order.
const std::vector<char32_t>& byte_to_char() {
  static const std::vector<char32_t> table = [] {
    std::vector<char32_t> map(256);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      map[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    return map;
  }();
  return table;
}

bool starts_with(const std::u32string& text, size_t pos, const char* literal) {
  for (size_t k = 0; literal[k] != '\0'; ++k) {
    if (pos + k >= text.size() || text[pos + k] != static_cast<char32_t>(literal[k])) return false;
  }
  return true;
}

size_t literal_length(const char* literal) { return std::char_traits<char>::length(literal); }

std::vector<std::pair<std::string, std::string>> read_merges_txt(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DP_CHECK(in.good(), path, ": cannot open");
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  for (int64_t line_number = 1; std::getline(in, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    DP_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos, path, ":", line_number,
             ": expected two symbols separated by one space, got ", files::quoted(line));
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  DP_CHECK(in.eof(), path, ": read error");
  return merges;
}

}  // namespace

ClipTokenizer ClipTokenizer::from_folder(const std::string& folder) {
  // The outer net catches what the per-file ones cannot name a file for (std::filesystem on the folder).
  return files::with_file(folder, [&] {
    ClipTokenizer tokenizer;
    const fs::path dir(folder);
    const std::string vocab_path = (dir / "vocab.json").string(), merges_path = (dir / "merges.txt").string();
    const std::string json_path = (dir / "tokenizer.json").string();
    std::vector<std::pair<std::string, std::string>> merges;
    std::string merges_source;  // the file the merges came from, for messages
    if (fs::exists(vocab_path) || !fs::exists(json_path)) {
      DP_CHECK(fs::exists(vocab_path), folder,
               ": CLIP tokenizer file vocab.json is missing (nor is there a tokenizer.json)");
      DP_CHECK(fs::exists(merges_path), folder, ": CLIP tokenizer file merges.txt is missing");
      files::with_file(vocab_path, [&] {
        tokenizer.read_vocab(files::read_object(vocab_path), vocab_path, "the vocabulary");
      });
      merges = files::with_file(merges_path, [&] { return read_merges_txt(merges_path); });
      merges_source = merges_path;
    } else {
      merges = files::with_file(json_path, [&] { return tokenizer.read_tokenizer_json(json_path); });
      merges_source = json_path;
    }
    files::with_file(merges_source, [&] {
      for (size_t rank = 0; rank < merges.size(); ++rank) {
        const auto& [left, right] = merges[rank];
        const int64_t a = tokenizer.token_id(left, merges_source), b = tokenizer.token_id(right, merges_source);
        const int64_t merged = tokenizer.token_id(left + right, merges_source);
        tokenizer.merges_.emplace(std::make_pair(a, b), std::make_pair(static_cast<int>(rank), merged));
      }
    });
    tokenizer.load_config(folder);
    return tokenizer;
  });
}

void ClipTokenizer::read_vocab(const nlohmann::json& vocab, const std::string& path, const std::string& field) {
  files::as_object(vocab, path, field);
  // Ids are dense, 0 .. size-1, as in every CLIP vocabulary; that bounds the id -> token table by the file.
  const auto max_id = static_cast<int64_t>(vocab.size()) - 1;
  vocab_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    vocab_[token] = files::as_integer_of(id, 0, max_id, path, [&, &token = token] {
      return str("the id of ", files::quoted(token), " in ", field);
    });
  }
  id_to_token_.resize(vocab.size());
  for (const auto& [token, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = token;
}

std::vector<std::pair<std::string, std::string>> ClipTokenizer::read_tokenizer_json(const std::string& path) {
  const nlohmann::json doc = files::read_object(path);
  const nlohmann::json& model = files::tokenizer_model(doc, path, "BPE");
  read_vocab(*files::member(model, "vocab"), path, "model.vocab");

  added_tokens_ = files::added_tokens(doc, vocab_size(), path);

  std::vector<std::pair<std::string, std::string>> merges;
  const nlohmann::json* merge_list = files::member(model, "merges");
  DP_CHECK(merge_list != nullptr, path, ": missing field 'model.merges'");
  files::as_array(*merge_list, path, "model.merges");
  for (size_t i = 0; i < merge_list->size(); ++i) {
    const nlohmann::json& merge = (*merge_list)[i];
    const auto field = [i] { return str("model.merges[", i, "]"); };
    if (merge.is_array()) {
      // tokenizers >= 0.20 writes ["a", "b"]; earlier versions "a b".
      DP_CHECK(merge.size() == 2, path, ": ", field(), " must hold two symbols, got ", files::describe(merge));
      merges.emplace_back(files::as_string_of(merge[0], path, [&] { return field() + "[0]"; }),
                          files::as_string_of(merge[1], path, [&] { return field() + "[1]"; }));
    } else {
      const std::string& text = files::as_string_of(merge, path, field);
      const size_t space = text.find(' ');
      DP_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos, path, ": ", field(),
               " must be two symbols separated by one space, got ", files::quoted(text));
      merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    }
  }
  return merges;
}

int64_t ClipTokenizer::token_id(const std::string& token, const std::string& what) const {
  const auto it = vocab_.find(token);
  DP_CHECK(it != vocab_.end(), what, ": token ", files::quoted(token), " is not in the vocabulary");
  return it->second;
}

void ClipTokenizer::load_config(const std::string& folder) {
  const std::string config_path = (fs::path(folder) / "tokenizer_config.json").string();
  const std::string map_path = (fs::path(folder) / "special_tokens_map.json").string();
  const auto config = fs::exists(config_path) ? files::read_object(config_path) : nlohmann::json::object();
  const auto special_map = fs::exists(map_path) ? files::read_object(map_path) : nlohmann::json::object();
  // A special token comes from tokenizer_config.json, else special_tokens_map.json, else CLIP's default.
  struct Special {
    std::string content;
    bool normalized = false;  // transformers' default for a token not listed in added_tokens_decoder
    std::string source;       // "<file> <key>", for messages
  };
  auto special = [&](const std::string& key, const std::string& fallback) {
    for (const auto& [doc, path] : {std::pair{&config, &config_path}, std::pair{&special_map, &map_path}}) {
      if (const nlohmann::json* token = files::member(*doc, key)) {
        return Special{files::token_content(*token, *path, key), files::token_normalized(*token, false, *path, key),
                       *path + " " + key};
      }
    }
    return Special{fallback, false, config_path + " " + key};
  };
  files::with_file(config_path, [&] {
    const Special bos = special("bos_token", "<|startoftext|>"), eos = special("eos_token", "<|endoftext|>");
    const Special pad = special("pad_token", "<|endoftext|>"), unk = special("unk_token", "<|endoftext|>");
    bos_id_ = token_id(bos.content, bos.source);
    eos_id_ = token_id(eos.content, eos.source);
    pad_id_ = token_id(pad.content, pad.source);
    unk_id_ = token_id(unk.content, unk.source);
    model_max_length_ = files::model_max_length(config, 77, 2, config_path);
    // Special tokens are split out before normalization unless their "normalized" flag says otherwise.
    const nlohmann::json* decoder = files::member(config, "added_tokens_decoder");
    if (!added_tokens_.empty()) {
      // Already read from tokenizer.json's added_tokens.
    } else if (decoder != nullptr) {
      for (const auto& [id, token] : files::as_object(*decoder, config_path, "added_tokens_decoder").items()) {
        const std::string field = "added_tokens_decoder[" + files::quoted(id) + "]";
        added_tokens_.push_back({files::token_content(token, config_path, field),
                                 files::parse_integer(id, 0, vocab_size() - 1, config_path, field),
                                 files::token_normalized(token, false, config_path, field)});
      }
    } else {
      for (const Special* token : {&bos, &eos, &pad, &unk}) {
        bool seen = false;
        for (const auto& added : added_tokens_) seen = seen || added.content == token->content;
        if (!seen) {
          added_tokens_.push_back({token->content, token_id(token->content, token->source), token->normalized});
        }
      }
    }
    for (const auto& added : added_tokens_)
      if (!added.normalized) raw_added_tokens_.push_back({added.content, added.id});
  });
}

void ClipTokenizer::encode_piece(const std::u32string& piece, std::vector<int64_t>& ids) const {
  // Byte-level symbols, "</w>" on the last; unknown symbols become separate unk ids.
  const std::string bytes = unicode::encode_utf8(piece);
  std::vector<int64_t> symbols;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string symbol;
    unicode::append_utf8(byte_to_char()[static_cast<unsigned char>(bytes[i])], symbol);
    if (i + 1 == bytes.size()) symbol += kEndOfWord;
    const auto it = vocab_.find(symbol);
    symbols.push_back(it == vocab_.end() ? unk_id_ : it->second);
  }
  // Merge the lowest-ranked adjacent pair (leftmost among equals) until none is mergeable.
  while (symbols.size() > 1) {
    int best_rank = -1;
    size_t best_pos = 0;
    int64_t best_id = -1;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = merges_.find({symbols[i], symbols[i + 1]});
      if (it != merges_.end() && (best_rank < 0 || it->second.first < best_rank)) {
        best_rank = it->second.first;
        best_pos = i;
        best_id = it->second.second;
      }
    }
    if (best_rank < 0) break;
    symbols[best_pos] = best_id;
    symbols.erase(symbols.begin() + static_cast<long>(best_pos) + 1);
  }
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

void ClipTokenizer::encode_normalized(const std::u32string& text, std::vector<int64_t>& ids) const {
  // CLIP's pre-tokenizer regex, alternatives in order, keeping only the matches:
  // <|startoftext|> | <|endoftext|> | 's|'t|'re|'ve|'m|'ll|'d | \p{L}+ | \p{N} | [^\s\p{L}\p{N}]+
  static const char* const kSpecials[] = {"<|startoftext|>", "<|endoftext|>"};
  static const char* const kContractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t c = text[pos];
    if (unicode::is_regex_space(c)) {
      ++pos;
      continue;
    }
    size_t end = pos;
    for (const char* special : kSpecials) {
      if (end == pos && starts_with(text, pos, special)) {
        // The byte-level GPT-2 split that follows cuts it into "<|", the name, "|>".
        const size_t length = literal_length(special);
        encode_piece(text.substr(pos, 2), ids);
        encode_piece(text.substr(pos + 2, length - 4), ids);
        encode_piece(text.substr(pos + length - 2, 2), ids);
        end = pos + length;
      }
    }
    if (end != pos) {
      pos = end;
      continue;
    }
    for (const char* contraction : kContractions) {
      if (end == pos && starts_with(text, pos, contraction)) end = pos + literal_length(contraction);
    }
    if (end == pos && unicode::is_letter(c)) {
      while (end < text.size() && unicode::is_letter(text[end])) ++end;
    } else if (end == pos && unicode::is_number(c)) {
      end = pos + 1;
    } else if (end == pos) {
      while (end < text.size() && !unicode::is_regex_space(text[end]) && !unicode::is_letter(text[end]) &&
             !unicode::is_number(text[end])) {
        ++end;
      }
    }
    encode_piece(text.substr(pos, end - pos), ids);
    pos = end;
  }
}

void ClipTokenizer::encode_plain(const std::string& raw, std::vector<int64_t>& ids) const {
  // Normalizer: NFC, each whitespace run to one space, lowercase.
  const std::u32string composed = unicode::nfc(unicode::decode_utf8(raw, "CLIP prompt"));
  std::u32string spaced;
  for (size_t i = 0; i < composed.size(); ++i) {
    if (!unicode::is_regex_space(composed[i])) {
      spaced += composed[i];
      continue;
    }
    spaced += U' ';
    while (i + 1 < composed.size() && unicode::is_regex_space(composed[i + 1])) ++i;
  }
  std::u32string normalized;
  for (char32_t c : spaced) unicode::append_lowercase(c, normalized);
  // Normalized special tokens are matched after normalization.
  size_t start = 0, pos = 0;
  while (pos < normalized.size()) {
    const AddedToken* match = nullptr;
    for (const auto& added : added_tokens_) {
      if (!added.normalized) continue;
      const std::u32string content = unicode::decode_utf8(added.content, "CLIP special token");
      if (normalized.compare(pos, content.size(), content) == 0 &&
          (match == nullptr || added.content.size() > match->content.size())) {
        match = &added;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    encode_normalized(normalized.substr(start, pos - start), ids);
    ids.push_back(match->id);
    pos += unicode::decode_utf8(match->content, "CLIP special token").size();
    start = pos;
  }
  encode_normalized(normalized.substr(start), ids);
}

std::vector<int64_t> ClipTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids{bos_id_};
  // Non-normalized special tokens are matched leftmost-longest in the raw text.
  encode_around_added_tokens(text, raw_added_tokens_, [&](const std::string& plain) { encode_plain(plain, ids); }, ids);
  ids.push_back(eos_id_);
  return ids;
}

std::vector<int64_t> ClipTokenizer::encode_padded(const std::string& text, int max_length) const {
  DP_CHECK(max_length >= 2, "CLIP tokenizer: max_length must be at least 2 (bos and eos), got ", max_length);
  std::vector<int64_t> ids = encode(text);
  if (static_cast<int>(ids.size()) > max_length) {
    const std::vector<int64_t> removed(ids.begin() + max_length - 1, ids.end() - 1);
    DP_WARN("The following part of your input was truncated because CLIP can only handle sequences up to ",
            max_length, " tokens: ", decode(removed));
    ids.resize(static_cast<size_t>(max_length) - 1);
    ids.push_back(eos_id_);
  }
  ids.resize(static_cast<size_t>(max_length), pad_id_);
  return ids;
}

std::string ClipTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> char_to_byte(512, -1);
  for (int b = 0; b < 256; ++b) char_to_byte[byte_to_char()[static_cast<size_t>(b)]] = b;
  std::string bytes;
  for (int64_t id : ids) {
    DP_CHECK(id >= 0 && id < vocab_size(), "CLIP decode: id ", id, " outside the vocabulary of ", vocab_size());
    // Special tokens are printable ASCII, which the byte map leaves unchanged.
    const std::string& token = id_to_token_[static_cast<size_t>(id)];
    for (char32_t c : unicode::decode_utf8(token, "CLIP vocabulary")) {
      if (c < char_to_byte.size() && char_to_byte[c] >= 0) bytes += static_cast<char>(char_to_byte[c]);
    }
  }
  std::string text;
  for (size_t i = 0; i < bytes.size();) {
    if (bytes.compare(i, kEndOfWord.size(), kEndOfWord) == 0) {
      text += ' ';
      i += kEndOfWord.size();
    } else {
      text += bytes[i++];
    }
  }
  const size_t first = text.find_first_not_of(' '), last = text.find_last_not_of(' ');
  return first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
}

}  // namespace dp::tokenizers
