#include "tokenizers/t5_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "tokenizers/tokenizer_files.h"
#include "tokenizers/unicode.h"

namespace dp::tokenizers {
namespace {

namespace fs = std::filesystem;
const std::string kMetaspace = "\xE2\x96\x81";  // U+2581, sentencepiece's visible space
constexpr double kUnknownPenalty = 10.0;          // tokenizers' Unigram K_UNK_PENALTY
// T5 folders say 100; the bound keeps a hostile extra_ids from growing the vocabulary without end.
constexpr int64_t kMaxExtraIds = 10000;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DP_CHECK(in.good(), path, ": cannot open");
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace

T5Tokenizer T5Tokenizer::from_folder(const std::string& folder) {
  // The outer net catches what the per-file ones cannot name a file for (std::filesystem on the folder).
  return files::with_file(folder, [&] {
    T5Tokenizer tokenizer;
    const std::string json_path = (fs::path(folder) / "tokenizer.json").string();
    const std::string spiece_path = (fs::path(folder) / "spiece.model").string();
    if (fs::exists(json_path)) {
      files::with_file(json_path, [&] { tokenizer.read_tokenizer_json(json_path); });
    } else if (fs::exists(spiece_path)) {
      files::with_file(spiece_path, [&] { tokenizer.read_spiece_model(spiece_path); });
    } else {
      DP_FAIL(folder, ": no T5 tokenizer found: neither tokenizer.json nor spiece.model exists");
    }
    const std::string config_path = (fs::path(folder) / "tokenizer_config.json").string();
    files::with_file(config_path, [&] { tokenizer.finish_loading(folder, config_path); });
    return tokenizer;
  });
}

void T5Tokenizer::read_tokenizer_json(const std::string& path) {
  const nlohmann::json doc = files::read_object(path);
  const nlohmann::json& model = files::tokenizer_model(doc, path, "Unigram", " for T5");
  const nlohmann::json* vocab = files::member(model, "vocab");
  files::as_array(*vocab, path, "model.vocab");
  pieces_.reserve(vocab->size());
  for (size_t i = 0; i < vocab->size(); ++i) {
    const nlohmann::json& entry = (*vocab)[i];
    const auto field = [i] { return str("model.vocab[", i, "]"); };
    DP_CHECK(entry.is_array() && entry.size() == 2, path, ": ", field(), " must be a [piece, score] pair, got ",
             files::describe(entry));
    pieces_.push_back({files::as_string_of(entry[0], path, [&] { return field() + "[0]"; }),
                       files::as_finite_number_of(entry[1], path, [&] { return field() + "[1]"; })});
  }

  // The normalizer is one Precompiled normalizer or a Sequence holding one; other kinds are not applied.
  const nlohmann::json* normalizer = files::member(doc, "normalizer");
  std::string normalizer_field = "normalizer";
  if (normalizer != nullptr) {
    files::as_object(*normalizer, path, normalizer_field);
    const nlohmann::json* kind = files::member(*normalizer, "type");
    if (kind != nullptr && files::as_string(*kind, path, "normalizer.type") == "Sequence") {
      const nlohmann::json* sequence = files::member(*normalizer, "normalizers");
      DP_CHECK(sequence != nullptr, path, ": missing field 'normalizer.normalizers'");
      files::as_array(*sequence, path, "normalizer.normalizers");
      normalizer = nullptr;
      for (size_t i = 0; i < sequence->size() && normalizer == nullptr; ++i) {
        const std::string field = str("normalizer.normalizers[", i, "]");
        const nlohmann::json* inner_kind = files::member(files::as_object((*sequence)[i], path, field), "type");
        if (inner_kind != nullptr && files::as_string(*inner_kind, path, field + ".type") == "Precompiled") {
          normalizer = &(*sequence)[i];
          normalizer_field = field;
        }
      }
    }
  }
  if (normalizer != nullptr) {
    const nlohmann::json* kind = files::member(*normalizer, "type");
    const nlohmann::json* charsmap = files::member(*normalizer, "precompiled_charsmap");
    if (kind != nullptr && *kind == "Precompiled" && charsmap != nullptr) {
      const std::string field = normalizer_field + ".precompiled_charsmap";
      charsmap_ = PrecompiledCharsmap::from_base64(files::as_string(*charsmap, path, field), path + ": " + field);
    }
  }

  // Added tokens index the model's vocabulary (T5's sentinels are part of it), which decode relies on.
  for (auto& added : files::added_tokens(doc, static_cast<int64_t>(pieces_.size()), path))
    added_tokens_.push_back({std::move(added.content), added.id});
}

void T5Tokenizer::read_spiece_model(const std::string& path) {
  sentencepiece::SentencePieceProcessor processor;
  const auto status = processor.Load(path);
  DP_CHECK(status.ok(), path, ": sentencepiece cannot load it: ", status.ToString());
  for (int id = 0; id < processor.GetPieceSize(); ++id) {
    pieces_.push_back({processor.IdToPiece(id), static_cast<double>(processor.GetScore(id))});
  }
  charsmap_ = PrecompiledCharsmap::from_sentencepiece_model(read_bytes(path), path);
}

void T5Tokenizer::finish_loading(const std::string& folder, const std::string& config_path) {
  const auto config = fs::exists(config_path) ? files::read_object(config_path) : nlohmann::json::object();
  const bool from_spiece = added_tokens_.empty();
  if (from_spiece) {
    // transformers appends the sentinels <extra_id_{n-1}> ... <extra_id_0> after the sentencepiece pieces.
    const nlohmann::json* extra_ids_value = files::member(config, "extra_ids");
    const int64_t extra_ids = extra_ids_value == nullptr
                                  ? 100
                                  : files::as_integer(*extra_ids_value, 0, kMaxExtraIds, config_path, "extra_ids");
    for (int64_t i = extra_ids - 1; i >= 0; --i) pieces_.push_back({"<extra_id_" + std::to_string(i) + ">", 0.0});
  }
  for (size_t id = 0; id < pieces_.size(); ++id) {
    piece_ids_.emplace(pieces_[id].text, static_cast<int64_t>(id));
    longest_piece_bytes_ = std::max(longest_piece_bytes_, pieces_[id].text.size());
  }
  double min_score = std::numeric_limits<double>::max();
  for (const auto& piece : pieces_) min_score = std::min(min_score, piece.score);
  unknown_score_ = min_score - kUnknownPenalty;
  auto id_of = [&](const std::string& key, const std::string& fallback) {
    const nlohmann::json* value = files::member(config, key);
    const std::string token = value == nullptr ? fallback : files::token_content(*value, config_path, key);
    const auto it = piece_ids_.find(token);
    DP_CHECK(it != piece_ids_.end(), config_path, ": ", key, " ", files::quoted(token), " is not in the vocabulary");
    return it->second;
  };
  eos_id_ = id_of("eos_token", "</s>");
  pad_id_ = id_of("pad_token", "<pad>");
  // T5Tokenizer builds its Unigram model with unk_id=2 whatever the folder says.
  unk_id_ = 2;
  DP_CHECK(static_cast<int64_t>(pieces_.size()) > unk_id_, folder, ": vocabulary too small (", pieces_.size(), ")");
  model_max_length_ = files::model_max_length(config, 512, 1, config_path);
  if (from_spiece) {
    for (const auto& token : {"<pad>", "</s>", "<unk>"}) {
      if (piece_ids_.count(token)) added_tokens_.push_back({token, piece_ids_.at(token)});
    }
    for (const auto& [text, id] : piece_ids_) {
      if (text.rfind("<extra_id_", 0) == 0) added_tokens_.push_back({text, id});
    }
  }
}

std::string T5Tokenizer::normalize(const std::string& text) const {
  if (charsmap_.empty()) return text;
  std::string out, replacement;
  for (const auto& grapheme : unicode::graphemes(unicode::decode_utf8(text, "T5 prompt"))) {
    const std::string bytes = unicode::encode_utf8(grapheme);
    if (bytes.size() < 6 && charsmap_.lookup(bytes, replacement)) {
      out += replacement;
      continue;
    }
    for (char32_t c : grapheme) {
      std::string one;
      unicode::append_utf8(c, one);
      out += charsmap_.lookup(one, replacement) ? replacement : one;
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
  encode_around_added_tokens(text, added_tokens_, [&](const std::string& segment) { encode_segment(segment, ids); },
                             ids);
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
