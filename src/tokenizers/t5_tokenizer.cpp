#include "tokenizers/t5_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "tokenizers/unicode.h"

namespace dp::tokenizers {
namespace {

namespace fs = std::filesystem;
const std::string kMetaspace = "\xE2\x96\x81";  // U+2581, sentencepiece's visible space
constexpr double kUnknownPenalty = 10.0;          // tokenizers' Unigram K_UNK_PENALTY

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DP_CHECK(in.good(), path, ": cannot open");
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

std::string base64_decode(const std::string& text, const std::string& what) {
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char ch : text) {
    int value;
    if (ch >= 'A' && ch <= 'Z') value = ch - 'A';
    else if (ch >= 'a' && ch <= 'z') value = ch - 'a' + 26;
    else if (ch >= '0' && ch <= '9') value = ch - '0' + 52;
    else if (ch == '+') value = 62;
    else if (ch == '/') value = 63;
    else if (ch == '=') break;
    else DP_FAIL(what, ": invalid base64 character '", ch, "'");
    buffer = (buffer << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  return out;
}

// Minimal protobuf wire reading: ModelProto.normalizer_spec (field 3).precompiled_charsmap (field 2).
uint64_t read_varint(const std::string& bytes, size_t& pos, const std::string& what) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    DP_CHECK(pos < bytes.size(), what, ": truncated protobuf varint");
    const auto byte = static_cast<unsigned char>(bytes[pos++]);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return value;
  }
  DP_FAIL(what, ": malformed protobuf varint");
}

std::string find_length_delimited(const std::string& bytes, uint32_t field, const std::string& what) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const uint64_t key = read_varint(bytes, pos, what);
    const uint32_t wire_type = key & 7;
    if (wire_type == 0) {
      read_varint(bytes, pos, what);
    } else if (wire_type == 1 || wire_type == 5) {
      pos += wire_type == 1 ? 8 : 4;
    } else if (wire_type == 2) {
      const uint64_t length = read_varint(bytes, pos, what);
      DP_CHECK(pos + length <= bytes.size(), what, ": truncated protobuf field ", (key >> 3));
      if ((key >> 3) == field) return bytes.substr(pos, length);
      pos += length;
    } else {
      DP_FAIL(what, ": unsupported protobuf wire type ", wire_type);
    }
  }
  return {};
}

// The charsmap is a darts-clone double array (uint32 units) followed by NUL-terminated replacement strings.
// Returns the replacement for the shortest trie key that prefixes `chunk`, as tokenizers' Precompiled does.
bool charsmap_lookup(const std::string& charsmap, const std::string& chunk, std::string& replacement) {
  if (charsmap.size() < 4) return false;
  uint32_t trie_bytes = 0;
  for (int i = 0; i < 4; ++i) trie_bytes |= static_cast<uint32_t>(static_cast<unsigned char>(charsmap[i])) << (8 * i);
  const size_t units = trie_bytes / 4;
  auto unit_at = [&](size_t index) {
    uint32_t unit = 0;
    for (int i = 0; i < 4; ++i) {
      unit |= static_cast<uint32_t>(static_cast<unsigned char>(charsmap[4 + 4 * index + i])) << (8 * i);
    }
    return unit;
  };
  auto offset = [](uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); };
  size_t node = 0;
  if (units == 0) return false;
  node ^= offset(unit_at(0));
  for (unsigned char c : chunk) {
    node ^= c;
    if (node >= units) return false;
    const uint32_t unit = unit_at(node);
    if ((unit & ((1u << 31) | 0xFF)) != c) return false;
    node ^= offset(unit);
    if (node >= units) return false;
    if ((unit >> 8) & 1) {
      const size_t value = unit_at(node) & ((1u << 31) - 1);
      const size_t start = 4 + trie_bytes + value;
      if (start > charsmap.size()) return false;
      const size_t end = charsmap.find('\0', start);
      replacement = charsmap.substr(start, end == std::string::npos ? std::string::npos : end - start);
      return true;
    }
  }
  return false;
}

std::string token_content(const nlohmann::json& token) {
  if (token.is_string()) return token.get<std::string>();
  if (token.is_object() && token.contains("content")) return token["content"].get<std::string>();
  return {};
}

}  // namespace

T5Tokenizer T5Tokenizer::from_folder(const std::string& folder) {
  T5Tokenizer tokenizer;
  const std::string json_path = (fs::path(folder) / "tokenizer.json").string();
  const std::string spiece_path = (fs::path(folder) / "spiece.model").string();
  if (fs::exists(json_path)) {
    const auto doc = read_json_file(json_path);
    DP_CHECK(doc.contains("model") && doc["model"].value("type", "") == "Unigram", json_path,
             ": expected a Unigram model for T5");
    for (const auto& entry : doc["model"]["vocab"]) {
      DP_CHECK(entry.is_array() && entry.size() == 2, json_path, ": malformed vocab entry ", entry.dump());
      tokenizer.pieces_.push_back({entry[0].get<std::string>(), entry[1].get<double>()});
    }
    nlohmann::json normalizers = doc.value("normalizer", nlohmann::json());
    if (normalizers.is_object() && normalizers.value("type", "") == "Sequence") normalizers = normalizers["normalizers"];
    if (normalizers.is_object()) normalizers = nlohmann::json::array({normalizers});
    for (const auto& normalizer : normalizers.is_array() ? normalizers : nlohmann::json::array()) {
      if (normalizer.value("type", "") == "Precompiled" && normalizer.contains("precompiled_charsmap") &&
          normalizer["precompiled_charsmap"].is_string()) {
        tokenizer.charsmap_ = base64_decode(normalizer["precompiled_charsmap"].get<std::string>(), json_path);
        break;
      }
    }
    for (const auto& added : doc.value("added_tokens", nlohmann::json::array())) {
      tokenizer.added_tokens_.emplace_back(added["content"].get<std::string>(), added["id"].get<int64_t>());
    }
  } else if (fs::exists(spiece_path)) {
    sentencepiece::SentencePieceProcessor processor;
    const auto status = processor.Load(spiece_path);
    DP_CHECK(status.ok(), spiece_path, ": sentencepiece cannot load it: ", status.ToString());
    for (int id = 0; id < processor.GetPieceSize(); ++id) {
      tokenizer.pieces_.push_back({processor.IdToPiece(id), static_cast<double>(processor.GetScore(id))});
    }
    const std::string model = read_bytes(spiece_path);
    tokenizer.charsmap_ = find_length_delimited(find_length_delimited(model, 3, spiece_path), 2, spiece_path);
  } else {
    DP_FAIL(folder, ": no T5 tokenizer found: neither tokenizer.json nor spiece.model exists");
  }
  tokenizer.finish_loading(folder);
  return tokenizer;
}

void T5Tokenizer::finish_loading(const std::string& folder) {
  const std::string config_path = (fs::path(folder) / "tokenizer_config.json").string();
  const auto config = fs::exists(config_path) ? read_json_file(config_path) : nlohmann::json::object();
  const bool from_spiece = added_tokens_.empty();
  if (from_spiece) {
    // transformers appends the sentinels <extra_id_{n-1}> ... <extra_id_0> after the sentencepiece pieces.
    const int extra_ids = json_get_or<int>(config, "extra_ids", 100, config_path);
    for (int i = extra_ids - 1; i >= 0; --i) pieces_.push_back({"<extra_id_" + std::to_string(i) + ">", 0.0});
  }
  for (size_t id = 0; id < pieces_.size(); ++id) {
    piece_ids_.emplace(pieces_[id].text, static_cast<int64_t>(id));
    longest_piece_bytes_ = std::max(longest_piece_bytes_, pieces_[id].text.size());
  }
  double min_score = std::numeric_limits<double>::max();
  for (const auto& piece : pieces_) min_score = std::min(min_score, piece.score);
  unknown_score_ = min_score - kUnknownPenalty;
  auto id_of = [&](const std::string& key, const std::string& fallback) {
    const std::string token = config.contains(key) ? token_content(config[key]) : fallback;
    const auto it = piece_ids_.find(token);
    DP_CHECK(it != piece_ids_.end(), config_path, ": ", key, " '", token, "' is not in the vocabulary");
    return it->second;
  };
  eos_id_ = id_of("eos_token", "</s>");
  pad_id_ = id_of("pad_token", "<pad>");
  // T5Tokenizer builds its Unigram model with unk_id=2 whatever the folder says.
  unk_id_ = 2;
  DP_CHECK(static_cast<int64_t>(pieces_.size()) > unk_id_, folder, ": vocabulary too small (", pieces_.size(), ")");
  const double max_length = json_get_or<double>(config, "model_max_length", 512.0, config_path);
  model_max_length_ = max_length > 1e9 ? 512 : static_cast<int>(max_length);
  if (from_spiece) {
    for (const auto& token : {"<pad>", "</s>", "<unk>"}) {
      if (piece_ids_.count(token)) added_tokens_.emplace_back(token, piece_ids_.at(token));
    }
    for (const auto& [text, id] : piece_ids_) {
      if (text.rfind("<extra_id_", 0) == 0) added_tokens_.emplace_back(text, id);
    }
  }
}

std::string T5Tokenizer::normalize(const std::string& text) const {
  if (charsmap_.empty()) return text;
  std::string out, replacement;
  for (const auto& grapheme : unicode::graphemes(unicode::decode_utf8(text, "T5 prompt"))) {
    const std::string bytes = unicode::encode_utf8(grapheme);
    if (bytes.size() < 6 && charsmap_lookup(charsmap_, bytes, replacement)) {
      out += replacement;
      continue;
    }
    for (char32_t c : grapheme) {
      std::string one;
      unicode::append_utf8(c, one);
      out += charsmap_lookup(charsmap_, one, replacement) ? replacement : one;
    }
  }
  return out;
}

void T5Tokenizer::encode_word(const std::string& word, std::vector<int64_t>& ids) const {
  // Viterbi over byte positions; ties keep the first candidate found (shorter pieces, earlier starts).
  struct Node {
    int64_t id = -1;
    double score = 0.0;
    size_t start = 0;
    bool reached = false;
  };
  const size_t size = word.size();
  std::vector<Node> best(size + 1);
  best[0].reached = true;
  size_t start = 0;
  while (start < size) {
    const auto lead = static_cast<unsigned char>(word[start]);
    const size_t char_bytes = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    bool has_single_char_piece = false;
    for (size_t length = 1; length <= longest_piece_bytes_ && start + length <= size; ++length) {
      const auto it = piece_ids_.find(word.substr(start, length));
      if (it == piece_ids_.end()) continue;
      const double candidate = best[start].score + pieces_[static_cast<size_t>(it->second)].score;
      Node& target = best[start + length];
      if (!target.reached || candidate > target.score) target = {it->second, candidate, start, true};
      if (length == char_bytes) has_single_char_piece = true;
    }
    if (!has_single_char_piece) {
      const double candidate = best[start].score + unknown_score_;
      Node& target = best[start + char_bytes];
      if (!target.reached || candidate > target.score) target = {unk_id_, candidate, start, true};
    }
    start += char_bytes;
  }
  // Walk back; runs of unknown pieces fuse into one unknown id.
  std::vector<int64_t> reversed;
  for (size_t end = size; end > 0; end = best[end].start) {
    const int64_t id = best[end].id;
    if (id == unk_id_ && !reversed.empty() && reversed.back() == unk_id_) continue;
    reversed.push_back(id);
  }
  ids.insert(ids.end(), reversed.rbegin(), reversed.rend());
}

void T5Tokenizer::encode_segment(const std::string& segment, std::vector<int64_t>& ids) const {
  const std::u32string normalized = unicode::decode_utf8(normalize(segment), "T5 prompt");
  std::u32string word;
  auto flush = [&] {
    if (word.empty()) return;
    // Metaspace: "▁" before the word (unless already there), then split before every "▁".
    std::string text = unicode::encode_utf8(word);
    if (text.rfind(kMetaspace, 0) != 0) text = kMetaspace + text;
    size_t begin = 0;
    while (begin < text.size()) {
      size_t next = text.find(kMetaspace, begin + kMetaspace.size());
      if (next == std::string::npos) next = text.size();
      encode_word(text.substr(begin, next - begin), ids);
      begin = next;
    }
    word.clear();
  };
  for (char32_t c : normalized) {
    if (unicode::is_rust_whitespace(c)) flush(); else word += c;
  }
  flush();
}

std::vector<int64_t> T5Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  // Special tokens are matched leftmost-longest in the raw text; the rest is normalized and split.
  size_t segment_start = 0, pos = 0;
  while (pos < text.size()) {
    const std::pair<std::string, int64_t>* match = nullptr;
    for (const auto& added : added_tokens_) {
      if (text.compare(pos, added.first.size(), added.first) == 0 &&
          (match == nullptr || added.first.size() > match->first.size())) {
        match = &added;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    encode_segment(text.substr(segment_start, pos - segment_start), ids);
    ids.push_back(match->second);
    pos += match->first.size();
    segment_start = pos;
  }
  encode_segment(text.substr(segment_start), ids);
  ids.push_back(eos_id_);
  return ids;
}

std::vector<int64_t> T5Tokenizer::encode_padded(const std::string& text, int max_length) const {
  DP_CHECK(max_length >= 1, "T5 tokenizer: max_length must be at least 1, got ", max_length);
  std::vector<int64_t> ids = encode(text);
  if (static_cast<int>(ids.size()) > max_length) {
    const std::vector<int64_t> removed(ids.begin() + max_length - 1, ids.end() - 1);
    DP_WARN("The following part of your input was truncated because `max_sequence_length` is set to ", max_length,
            " tokens: ", decode(removed));
    ids.resize(static_cast<size_t>(max_length) - 1);
    ids.push_back(eos_id_);
  }
  ids.resize(static_cast<size_t>(max_length), pad_id_);
  return ids;
}

std::string T5Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string joined;
  for (int64_t id : ids) {
    DP_CHECK(id >= 0 && id < vocab_size(), "T5 decode: id ", id, " outside the vocabulary of ", vocab_size());
    joined += pieces_[static_cast<size_t>(id)].text;
  }
  std::string out;
  for (size_t i = 0; i < joined.size();) {
    if (joined.compare(i, kMetaspace.size(), kMetaspace) == 0) {
      out += ' ';
      i += kMetaspace.size();
    } else {
      out += joined[i++];
    }
  }
  if (!out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace dp::tokenizers
