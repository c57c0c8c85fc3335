// Tokenizer folders of the tiny pipeline (declared in tiny_components.h): built here from a small English
// word list, so make-tiny needs no download and no Python.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "models/tokenizer_unicode.h"
#include "pipeline/tiny_components.h"

namespace fs = std::filesystem;

namespace dp::pipeline {
namespace {

// Common prompt words; CLIP learns its merges on them and T5 gets each as a "▁word" piece, in this order
// (earlier words score higher).
const char* const kWords =
    "a the of and in on with to at by for from an is it this that as or be are its into over under near "
    "cat dog bird fish horse cow sheep lion tiger bear wolf fox owl rabbit mouse dragon robot person man woman "
    "child girl boy people face portrait eyes hair hand smile king queen knight wizard astronaut "
    "tree trees forest flower flowers garden grass leaf leaves mountain mountains river lake sea ocean beach "
    "island desert snow rain cloud clouds sky sun moon star stars night day morning evening sunset sunrise "
    "light shadow fire water stone rock sand ice wind storm fog city street road bridge house castle tower "
    "room window door table chair car train boat ship plane space planet earth world village market "
    "red orange yellow green blue purple pink brown black white gray grey gold silver dark bright "
    "big small tall old young new ancient modern beautiful cute happy sad quiet calm wild "
    "photo photograph painting drawing sketch illustration render art style film still cinematic moody "
    "grain detailed highly realistic photorealistic digital oil watercolor anime cartoon epic fantasy "
    "lighting soft warm cold golden hour studio close up wide angle shot view background foreground "
    "sitting standing walking running flying swimming holding wearing looking playing reading eating "
    "drinking sipping sleeping dancing riding glass cup coffee tea wine margarita pool palm springs "
    "book hat dress coat shirt jacket crown sword shield flag sign text word letter "
    "one two three four five many some all every very more most much little long short high low "
    "front back top bottom left right side middle center inside outside above below behind between "
    "quick lazy jumps brown fox dog sheep farm field hill valley cave temple church park";

std::vector<std::string> word_list() {
  std::vector<std::string> words;
  std::istringstream in(kWords);
  for (std::string w; in >> w;) {
    if (std::find(words.begin(), words.end(), w) == words.end()) words.push_back(w);
  }
  return words;
}


// GPT-2's byte-to-unicode table, which CLIP uses: printable Latin-1 bytes stand for themselves, the others
// map to U+0100, U+0101, ... in byte order. Symbols are listed in byte order, as CLIP's vocab.json has them.
std::vector<std::string> byte_symbols() {
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  std::vector<std::string> symbols(256);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) models::unicode::append_utf8(printable(b) ? static_cast<char32_t>(b) : next++, symbols[b]);
  return symbols;
}

using Word = std::vector<std::string>;  // symbols; the last carries "</w>"
using Merge = std::pair<std::string, std::string>;

// Plain BPE training: repeatedly merge the most frequent adjacent pair (ties: the smallest pair), as the
// reference tokenizers were built. Words here are lowercase ASCII, so the byte symbols are the characters.
std::vector<Merge> learn_merges(const std::vector<std::string>& words, size_t count) {
  std::vector<Word> corpus;
  for (const auto& w : words) {
    Word symbols;
    for (char ch : w) symbols.emplace_back(1, ch);
    symbols.back() += "</w>";
    corpus.push_back(std::move(symbols));
  }
  std::vector<Merge> merges;
  while (merges.size() < count) {
    std::map<Merge, int> pairs;
    for (const Word& w : corpus)
      for (size_t i = 0; i + 1 < w.size(); ++i) ++pairs[{w[i], w[i + 1]}];
    if (pairs.empty()) break;
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second > best->second) best = it;
    const Merge merge = best->first;
    merges.push_back(merge);
    for (Word& w : corpus) {
      Word merged;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == merge.first && w[i + 1] == merge.second) {
          merged.push_back(w[i] + w[i + 1]);
          ++i;
        } else {
          merged.push_back(w[i]);
        }
      }
      w = std::move(merged);
    }
  }
  return merges;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
  DP_CHECK(file.good(), path.string(), ": write failed");
}

void write_json(const fs::path& path, const nlohmann::json& doc) { write_text(path, doc.dump(2) + "\n"); }

nlohmann::json added_token(const std::string& content, bool normalized) {
  return {{"content", content}, {"lstrip", false}, {"normalized", normalized}, {"rstrip", false},
          {"single_word", false}};
}

const std::string kMetaspace = "\xE2\x96\x81";  // "▁", sentencepiece's visible space

}  // namespace

TinyTokenizerInfo write_tiny_clip_tokenizer(const std::string& dir) {
  fs::create_directories(dir);
  const std::vector<std::string> symbols = byte_symbols();
  // Insertion order is the id order; nlohmann's object sorts keys, so ids are kept explicitly.
  std::vector<std::string> tokens = symbols;
  for (const auto& s : symbols) tokens.push_back(s + "</w>");
  std::map<std::string, int64_t> vocab;
  for (size_t i = 0; i < tokens.size(); ++i) vocab.emplace(tokens[i], static_cast<int64_t>(i));
  const std::vector<Merge> merges = learn_merges(word_list(), 400);
  for (const auto& [a, b] : merges) vocab.emplace(a + b, static_cast<int64_t>(vocab.size()));
  TinyTokenizerInfo info;
  info.bos_id = static_cast<int64_t>(vocab.size());
  info.eos_id = info.bos_id + 1;
  info.pad_id = info.eos_id;  // FLUX.1-dev pads CLIP with <|endoftext|>
  vocab.emplace("<|startoftext|>", info.bos_id);
  vocab.emplace("<|endoftext|>", info.eos_id);
  info.vocab_size = static_cast<int64_t>(vocab.size());

  write_text(fs::path(dir) / "vocab.json", nlohmann::json(vocab).dump() + "\n");
  std::string merges_text = "#version: 0.2\n";
  for (const auto& [a, b] : merges) merges_text += a + " " + b + "\n";
  write_text(fs::path(dir) / "merges.txt", merges_text);

  // As FLUX.1-dev's tokenizer/ (CLIPTokenizer of openai/clip-vit-large-patch14).
  nlohmann::json bos = added_token("<|startoftext|>", true), eos = added_token("<|endoftext|>", true);
  nlohmann::json decoder = nlohmann::json::object();
  decoder[std::to_string(info.bos_id)] = bos;
  decoder[std::to_string(info.bos_id)]["special"] = true;
  decoder[std::to_string(info.eos_id)] = eos;
  decoder[std::to_string(info.eos_id)]["special"] = true;
  write_json(fs::path(dir) / "tokenizer_config.json",
             {{"add_prefix_space", false},
              {"added_tokens_decoder", decoder},
              {"bos_token", "<|startoftext|>"},
              {"clean_up_tokenization_spaces", true},
              {"do_lower_case", true},
              {"eos_token", "<|endoftext|>"},
              {"errors", "replace"},
              {"model_max_length", 77},
              {"pad_token", "<|endoftext|>"},
              {"tokenizer_class", "CLIPTokenizer"},
              {"unk_token", "<|endoftext|>"}});
  write_json(fs::path(dir) / "special_tokens_map.json",
             {{"bos_token", bos}, {"eos_token", eos}, {"pad_token", "<|endoftext|>"}, {"unk_token", eos}});
  return info;
}

TinyTokenizerInfo write_tiny_t5_tokenizer(const std::string& dir) {
  fs::create_directories(dir);
  constexpr int kExtraIds = 100;
  // Scores are log-probability-like and all distinct, so Viterbi never meets a tie: a whole word (-5 to
  // -9) always beats spelling it out ("▁" at -3 plus -7 or less per character).
  nlohmann::json vocab = nlohmann::json::array();
  for (const char* special : {"<pad>", "</s>", "<unk>"}) vocab.push_back({special, 0.0});
  vocab.push_back({kMetaspace, -3.0});
  const std::vector<std::string> words = word_list();
  for (size_t i = 0; i < words.size(); ++i) vocab.push_back({kMetaspace + words[i], -5.0 - 0.013 * double(i)});
  std::string characters;
  for (char c = 'a'; c <= 'z'; ++c) characters += c;
  for (char c = 'A'; c <= 'Z'; ++c) characters += c;
  for (char c = '0'; c <= '9'; ++c) characters += c;
  characters += ".,!?;:'\"-()[]{}/\\&%$#@*+=<>_~`^|";
  for (size_t i = 0; i < characters.size(); ++i) vocab.push_back({std::string(1, characters[i]), -7.0 - 0.017 * double(i)});

  nlohmann::json added = nlohmann::json::array();
  auto add_special = [&](const std::string& content, int64_t id) {
    nlohmann::json token = added_token(content, false);
    token["id"] = id;
    token["special"] = true;
    added.push_back(token);
  };
  for (int64_t id = 0; id < 3; ++id) add_special(vocab[static_cast<size_t>(id)][0].get<std::string>(), id);
  // T5 appends its sentinels in reverse: <extra_id_99> first, <extra_id_0> last.
  std::vector<std::string> sentinels;
  for (int i = 0; i < kExtraIds; ++i) sentinels.push_back("<extra_id_" + std::to_string(i) + ">");
  for (int i = kExtraIds - 1; i >= 0; --i) {
    add_special(sentinels[static_cast<size_t>(i)], static_cast<int64_t>(vocab.size()));
    vocab.push_back({sentinels[static_cast<size_t>(i)], 0.0});
  }

  const nlohmann::json metaspace = {{"type", "Metaspace"}, {"replacement", kMetaspace}, {"prepend_scheme", "always"},
                                    {"split", true}};
  const nlohmann::json eos_part = {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}};
  auto sequence = [](const char* id) { return nlohmann::json{{"Sequence", {{"id", id}, {"type_id", 0}}}}; };
  // What T5TokenizerFast.save_pretrained writes, minus the Precompiled normalizer (see the header).
  nlohmann::json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "WhitespaceSplit"}}, metaspace}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {sequence("A"), eos_part}},
        {"pair", {sequence("A"), eos_part, sequence("B"), eos_part}},
        {"special_tokens", {{"</s>", {{"id", "</s>"}, {"ids", {1}}, {"tokens", {"</s>"}}}}}}}},
      {"decoder", metaspace},
      {"model", {{"type", "Unigram"}, {"unk_id", 2}, {"vocab", vocab}, {"byte_fallback", false}}}};
  write_json(fs::path(dir) / "tokenizer.json", tokenizer);

  nlohmann::json decoder = nlohmann::json::object();
  for (const auto& token : added) {
    nlohmann::json entry = token;
    entry.erase("id");
    decoder[std::to_string(token["id"].get<int64_t>())] = entry;
  }
  // As FLUX.1-dev's tokenizer_2/ (google/t5-v1_1-xxl's T5Tokenizer).
  write_json(fs::path(dir) / "tokenizer_config.json",
             {{"added_tokens_decoder", decoder},
              {"additional_special_tokens", sentinels},
              {"clean_up_tokenization_spaces", true},
              {"eos_token", "</s>"},
              {"extra_ids", kExtraIds},
              {"legacy", true},
              {"model_max_length", 512},
              {"pad_token", "<pad>"},
              {"sp_model_kwargs", nlohmann::json::object()},
              {"tokenizer_class", "T5Tokenizer"},
              {"unk_token", "<unk>"}});
  write_json(fs::path(dir) / "special_tokens_map.json",
             {{"additional_special_tokens", sentinels},
              {"eos_token", added_token("</s>", false)},
              {"pad_token", added_token("<pad>", false)},
              {"unk_token", added_token("<unk>", false)}});
  TinyTokenizerInfo info;
  info.vocab_size = static_cast<int64_t>(vocab.size());
  info.eos_id = 1;
  info.pad_id = 0;
  return info;
}

}  // namespace dp::pipeline
