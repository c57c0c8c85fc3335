// CLIP and T5 tokenizers against transformers (tests/reference/cases_tokenizers.py): every corpus prompt
// must give exactly transformers' ids, padded and untruncated, from every folder layout.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "core/error.h"
#include "core/json_file.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/precompiled_charsmap.h"
#include "tokenizers/t5_tokenizer.h"
#include "tokenizers/unicode.h"
#include "test_support.h"

namespace dp::tokenizers {
namespace {

namespace fs = std::filesystem;

std::string tokenizer_reference() { return dp::test::reference_dir() + "/tokenizers"; }

nlohmann::json load_cases() {
  const std::string path = tokenizer_reference() + "/cases.json";
  if (!fs::exists(path)) {
    ADD_FAILURE() << "oracle output missing: " << path;
    return nlohmann::json::object();
  }
  return read_json_file(path);
}

template <typename Tokenizer>
void expect_matches(const std::string& folder_name, const nlohmann::json& cases) {
  const Tokenizer tokenizer = Tokenizer::from_folder(tokenizer_reference() + "/" + folder_name);
  ASSERT_GT(cases.size(), 30u);
  for (const auto& c : cases) {
    const std::string prompt = c["prompt"].get<std::string>();
    SCOPED_TRACE(folder_name + " prompt: " + prompt.substr(0, 80));
    EXPECT_EQ(tokenizer.encode(prompt), c["untruncated"].template get<std::vector<int64_t>>());
    for (const auto& [max_length, ids] : c["padded"].items()) {
      EXPECT_EQ(tokenizer.encode_padded(prompt, std::stoi(max_length)), ids.template get<std::vector<int64_t>>())
          << "max_length " << max_length;
    }
  }
}

TEST(ClipTokenizer, MatchesTransformersFromVocabAndMerges) {
  const auto cases = load_cases();
  ASSERT_TRUE(cases.contains("clip_hub"));
  expect_matches<ClipTokenizer>("clip_hub", cases["clip_hub"]["cases"]);
}

TEST(ClipTokenizer, MatchesTransformersFromSavedTokenizerJson) {
  const auto cases = load_cases();
  ASSERT_TRUE(cases.contains("clip_saved"));
  expect_matches<ClipTokenizer>("clip_saved", cases["clip_saved"]["cases"]);
}

// <|endoftext|> with normalized false: matched in the raw text (case and spacing as written), the path the
// other folders' normalized special tokens never take.
TEST(ClipTokenizer, MatchesTransformersWithARawSpecialToken) {
  const auto cases = load_cases();
  ASSERT_TRUE(cases.contains("clip_raw_eos"));
  expect_matches<ClipTokenizer>("clip_raw_eos", cases["clip_raw_eos"]["cases"]);
}

TEST(T5Tokenizer, MatchesTransformersFromSpieceModel) {
  const auto cases = load_cases();
  ASSERT_TRUE(cases.contains("t5_spiece"));
  expect_matches<T5Tokenizer>("t5_spiece", cases["t5_spiece"]["cases"]);
}

TEST(T5Tokenizer, MatchesTransformersFromTokenizerJsonOnly) {
  const auto cases = load_cases();
  ASSERT_TRUE(cases.contains("t5_json"));
  expect_matches<T5Tokenizer>("t5_json", cases["t5_json"]["cases"]);
}

TEST(ClipTokenizer, PaddingAndSpecialIdsComeFromTheFolder) {
  const auto clip = ClipTokenizer::from_folder(tokenizer_reference() + "/clip_hub");
  EXPECT_EQ(clip.model_max_length(), 77);
  const auto ids = clip.encode_padded("a photo of a cat");
  ASSERT_EQ(ids.size(), 77u);
  EXPECT_EQ(ids.front(), clip.bos_id());
  EXPECT_EQ(ids.back(), clip.pad_id());
  EXPECT_EQ(clip.decode(clip.encode("a photo of a cat")), "<|startoftext|>a photo of a cat <|endoftext|>");
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const dp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tokenizers, MissingFilesNameTheFolderAndFile) {
  const std::string dir = dp::test::temp_dir("tokenizer");
  const std::string clip_error = error_of([&] { ClipTokenizer::from_folder(dir); });
  EXPECT_NE(clip_error.find(dir), std::string::npos) << clip_error;
  EXPECT_NE(clip_error.find("vocab.json"), std::string::npos) << clip_error;
  dp::test::write_file(dir + "/vocab.json", "{}");
  const std::string merges_error = error_of([&] { ClipTokenizer::from_folder(dir); });
  EXPECT_NE(merges_error.find("merges.txt"), std::string::npos) << merges_error;
  const std::string t5_error = error_of([&] { T5Tokenizer::from_folder(dir); });
  EXPECT_NE(t5_error.find(dir), std::string::npos) << t5_error;
  EXPECT_NE(t5_error.find("spiece.model"), std::string::npos) << t5_error;
  EXPECT_NE(t5_error.find("tokenizer.json"), std::string::npos) << t5_error;
}

TEST(Tokenizers, InvalidUtf8IsRejected) {
  const auto clip = ClipTokenizer::from_folder(tokenizer_reference() + "/clip_hub");
  const std::string message = error_of([&] { clip.encode("bad \xC3 byte"); });
  EXPECT_NE(message.find("invalid UTF-8"), std::string::npos) << message;
}

// --- Malformed tokenizer files: each is a one-line dp::Error naming the file and what is wrong --------------

// The message of the dp::Error `action` throws; fails the test when it throws nothing (any other exception
// escapes and fails the test too, which is what nlohmann and the standard library used to throw).
std::string load_error(const std::function<void()>& action) {
  const std::string message = error_of(action);
  EXPECT_FALSE(message.empty()) << "expected a dp::Error";
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  return message;
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

const nlohmann::json kMiniClipVocab = {{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}, {"<|startoftext|>", 3},
                                      {"<|endoftext|>", 4}};

std::string clip_folder(const nlohmann::json& vocab, const std::string& config = "") {
  const std::string dir = dp::test::temp_dir("clip");
  dp::test::write_file(dir + "/vocab.json", vocab.dump());
  dp::test::write_file(dir + "/merges.txt", "#version: 0.2\na b</w>\n");
  if (!config.empty()) dp::test::write_file(dir + "/tokenizer_config.json", config);
  return dir;
}

std::string base64(const std::string& bytes) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (size_t k = 0; k < 3; ++k) group = (group << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

std::string le32(uint32_t value) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[static_cast<size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return out;
}

// A charsmap blob: trie size, units, replacements. `claimed_trie_bytes` lies about the size when given.
std::string charsmap_blob(const std::vector<uint32_t>& units, const std::string& replacements,
                          int64_t claimed_trie_bytes = -1) {
  std::string blob = le32(claimed_trie_bytes < 0 ? static_cast<uint32_t>(4 * units.size())
                                                 : static_cast<uint32_t>(claimed_trie_bytes));
  for (uint32_t unit : units) blob += le32(unit);
  return blob + replacements;
}

// A one-key darts trie in sentencepiece's 256-unit block: "a" -> the replacement at offset 0. The root's
// offset 1 puts "a" at 1 ^ 'a' = 0x60, whose offset 0x10 puts the value at 0x70 (darts-clone's layout).
std::vector<uint32_t> trie_mapping_a() {
  std::vector<uint32_t> units(256, 0);
  units[0] = 1u << 10;
  units[0x60] = 'a' | (1u << 8) | (0x10u << 10);
  units[0x70] = 1u << 31;
  return units;
}

std::string t5_folder(const std::string& charsmap_blob_bytes) {
  const std::string dir = dp::test::temp_dir("t5");
  nlohmann::json vocab = nlohmann::json::array(
      {{"<pad>", 0.0}, {"</s>", 0.0}, {"<unk>", 0.0}, {"\u2581", -2.0}, {"a", -3.0}, {"b", -3.0}, {"\u2581a", -1.0}});
  const nlohmann::json tokenizer = {
      {"added_tokens", {{{"id", 0}, {"content", "<pad>"}}, {{"id", 1}, {"content", "</s>"}}}},
      {"normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", base64(charsmap_blob_bytes)}}},
      {"model", {{"type", "Unigram"}, {"vocab", vocab}}}};
  dp::test::write_file(dir + "/tokenizer.json", tokenizer.dump());
  return dir;
}

TEST(T5Tokenizer, CharsmapClaimingALargerTrieThanItHoldsFailsCleanly) {
  // The trie size says 4 GB; the root's offset (0x3FFFFF << 8, via the shift bit 9) points as far. The old
  // reader trusted the size and read about 4 GB past the buffer: SIGSEGV on the first prompt.
  const std::string dir = t5_folder(charsmap_blob({0xFFFFFE00u}, std::string("x\0", 2), 0xFFFFFFFC));
  const std::string message = load_error([&] { T5Tokenizer::from_folder(dir).encode("a cat"); });
  EXPECT_CONTAINS(message, dir + "/tokenizer.json");
  EXPECT_CONTAINS(message, "precompiled_charsmap");
  EXPECT_CONTAINS(message, "claims a trie of 4294967292 bytes but holds only 6 bytes");
}

TEST(T5Tokenizer, CharsmapIsValidatedWholeAtLoad) {
  // A replacement that is not UTF-8 used to surface only when a prompt hit it, blamed on the prompt.
  const std::string bad_replacement = t5_folder(charsmap_blob(trie_mapping_a(), std::string("\x80\0", 2)));
  std::string message = load_error([&] { T5Tokenizer::from_folder(bad_replacement); });
  EXPECT_CONTAINS(message, bad_replacement + "/tokenizer.json");
  EXPECT_CONTAINS(message, "replacement at offset 0: invalid UTF-8");

  std::vector<uint32_t> outside = trie_mapping_a();
  outside[0x60] = 'a' | (1u << 8) | (0x1FFFFFu << 10);  // the value index lands far outside the 256 units
  message = load_error([&] { T5Tokenizer::from_folder(t5_folder(charsmap_blob(outside, std::string("A\0", 2)))); });
  EXPECT_CONTAINS(message, "points at unit");

  message = load_error([&] { T5Tokenizer::from_folder(t5_folder(charsmap_blob(trie_mapping_a(), "A"))); });
  EXPECT_CONTAINS(message, "not NUL-terminated");

  // The same trie with a good replacement loads and normalizes "a" to "b".
  const auto tokenizer = T5Tokenizer::from_folder(t5_folder(charsmap_blob(trie_mapping_a(), std::string("b\0", 2))));
  EXPECT_EQ(tokenizer.encode("a"), (std::vector<int64_t>{3, 5, 1}));  // "▁", "b", "</s>"
}

TEST(PrecompiledCharsmap, ReadersRejectMalformedFraming) {
  EXPECT_CONTAINS(load_error([] { PrecompiledCharsmap::from_base64("AA==AAAA", "t.json"); }), "invalid base64");
  EXPECT_CONTAINS(load_error([] { PrecompiledCharsmap::from_base64("AAAAA==", "t.json"); }), "multiple of 4");
  EXPECT_CONTAINS(load_error([] { PrecompiledCharsmap::from_blob("abc", "t.json"); }), "shorter than its header");
  // ModelProto field 3, length 2^63: the old reader added it to the position, wrapped around and looped.
  const std::string huge_length = std::string("\x1a") + "\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01";
  EXPECT_CONTAINS(load_error([&] { PrecompiledCharsmap::from_sentencepiece_model(huge_length, "s.model"); }),
                  "claims 9223372036854775808 bytes but 0 remain");
  const std::string overlong = "\x1a" + std::string(10, '\xff') + "\x01";
  EXPECT_CONTAINS(load_error([&] { PrecompiledCharsmap::from_sentencepiece_model(overlong, "s.model"); }),
                  "overflows 64 bits");
  EXPECT_CONTAINS(load_error([] { PrecompiledCharsmap::from_sentencepiece_model("\x1a", "s.model"); }),
                  "truncated protobuf varint");
  EXPECT_CONTAINS(load_error([] { PrecompiledCharsmap::from_sentencepiece_model("\x0d\x01", "s.model"); }),
                  "truncated protobuf field 1");
}

// --- spiece.model, written field by field (sentencepiece_model.proto) ---

std::string varint(uint64_t value) {
  std::string out;
  for (; value >= 0x80; value >>= 7) out += static_cast<char>((value & 0x7F) | 0x80);
  return out + static_cast<char>(value);
}
std::string bytes_field(int number, const std::string& payload) {
  return varint(static_cast<uint64_t>(number) << 3 | 2) + varint(payload.size()) + payload;
}
std::string varint_field(int number, uint64_t value) { return varint(static_cast<uint64_t>(number) << 3) + varint(value); }

// ModelProto: pieces <pad> </s> (CONTROL) <unk> (UNKNOWN) ▁ a b and `extra_piece` if any (NORMAL),
// trainer_spec (unigram), normalizer_spec.
std::string spiece_model(const std::string& charsmap, const std::string& extra_piece = "") {
  std::string model;
  std::vector<std::pair<std::string, int>> pieces = {{"<pad>", 3}, {"</s>", 3}, {"<unk>", 2},
                                                     {"\u2581", 1}, {"a", 1}, {"b", 1}};
  if (!extra_piece.empty()) pieces.emplace_back(extra_piece, 1);
  for (const auto& [piece, type] : pieces) {
    const std::string score = "\x15" + le32(0xC0000000u);  // field 2, fixed32: -2.0f
    model += bytes_field(1, bytes_field(1, piece) + score + varint_field(3, static_cast<uint64_t>(type)));
  }
  model += bytes_field(2, varint_field(3, 1) + varint_field(40, 2) + varint_field(42, 1) + varint_field(43, 0));
  return model + bytes_field(3, bytes_field(1, "custom") + bytes_field(2, charsmap));
}

TEST(T5Tokenizer, SpieceModelIsCheckedToo) {
  const std::string dir = dp::test::temp_dir("spiece");
  const std::string model = spiece_model(charsmap_blob(trie_mapping_a(), std::string("b\0", 2)));
  dp::test::write_file(dir + "/spiece.model", model);
  EXPECT_EQ(T5Tokenizer::from_folder(dir).encode("a"), (std::vector<int64_t>{3, 5, 1}));

  for (const size_t length : {model.size() / 2, model.size() - 1, size_t{3}}) {
    SCOPED_TRACE(length);
    dp::test::write_file(dir + "/spiece.model", model.substr(0, length));
    EXPECT_CONTAINS(load_error([&] { T5Tokenizer::from_folder(dir); }), dir + "/spiece.model");
  }
  // sentencepiece accepts this file (it does not look inside the trie); our check at load does not.
  dp::test::write_file(dir + "/spiece.model", spiece_model(charsmap_blob(trie_mapping_a(), std::string("\xff\0", 2))));
  const std::string message = load_error([&] { T5Tokenizer::from_folder(dir); });
  EXPECT_CONTAINS(message, dir + "/spiece.model normalizer_spec.precompiled_charsmap");
  EXPECT_CONTAINS(message, "invalid UTF-8");
}

TEST(T5Tokenizer, SentencepieceExceptionsNameTheFile) {
  // sentencepiece's Load lets darts-clone's own exception type out for a piece that starts with NUL (found by
  // spiece_fuzz); it used to escape from_folder as is, naming no file.
  const std::string dir = dp::test::temp_dir("spiece");
  dp::test::write_file(dir + "/spiece.model", spiece_model("", std::string("\0x", 2)));
  const std::string message = load_error([&] { T5Tokenizer::from_folder(dir); });
  EXPECT_CONTAINS(message, dir + "/spiece.model: cannot read it");
  EXPECT_CONTAINS(message, "zero-length key");
}

TEST(Tokenizers, WrongJsonTypesNameTheFileAndField) {
  // nlohmann used to escape as "[json.exception.type_error.302] type must be number, but is string".
  std::string dir = clip_folder({{"a", "zero"}, {"b</w>", 1}});
  std::string message = load_error([&] { ClipTokenizer::from_folder(dir); });
  EXPECT_CONTAINS(message, dir + "/vocab.json");
  EXPECT_CONTAINS(message, "the id of 'a'");
  EXPECT_CONTAINS(message, "must be an integer, got the string 'zero'");

  dir = clip_folder(kMiniClipVocab, R"({"bos_token": {"content": 3}})");
  message = load_error([&] { ClipTokenizer::from_folder(dir); });
  EXPECT_CONTAINS(message, dir + "/tokenizer_config.json");
  EXPECT_CONTAINS(message, "bos_token.content must be a string");

  dir = dp::test::temp_dir("t5");
  dp::test::write_file(dir + "/tokenizer.json", R"({"model": {"type": "Unigram", "vocab": [["<pad>", "zero"]]}})");
  message = load_error([&] { T5Tokenizer::from_folder(dir); });
  EXPECT_CONTAINS(message, dir + "/tokenizer.json");
  EXPECT_CONTAINS(message, "model.vocab[0][1] must be a number");

  // A const lookup of a missing key is undefined behaviour in nlohmann, not an exception.
  dir = dp::test::temp_dir("clip_json");
  dp::test::write_file(dir + "/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}}})");
  EXPECT_CONTAINS(load_error([&] { ClipTokenizer::from_folder(dir); }), "missing field 'model.merges'");
}

TEST(Tokenizers, BadNumbersNameTheFileAndField) {
  // std::stoll used to escape as a bare "stoll".
  std::string dir = clip_folder(kMiniClipVocab, R"({"added_tokens_decoder": {"abc": {"content": "<|endoftext|>"}}})");
  std::string message = load_error([&] { ClipTokenizer::from_folder(dir); });
  EXPECT_CONTAINS(message, dir + "/tokenizer_config.json");
  EXPECT_CONTAINS(message, "added_tokens_decoder['abc']");
  EXPECT_CONTAINS(message, "not a non-negative decimal integer");

  // Fractions used to be truncated silently.
  dir = clip_folder(kMiniClipVocab, R"({"model_max_length": 2.7})");
  EXPECT_CONTAINS(load_error([&] { ClipTokenizer::from_folder(dir); }), "model_max_length must be an integer");
  dir = clip_folder({{"a", 0}, {"b</w>", 1.0}, {"ab</w>", 2}, {"<|startoftext|>", 3}, {"<|endoftext|>", 4}});
  EXPECT_CONTAINS(load_error([&] { ClipTokenizer::from_folder(dir); }), "the id of 'b</w>'");
}

TEST(Tokenizers, AbsurdSizesAreRefused) {
  // The id -> token table used to be sized by the largest id: std::length_error or std::bad_alloc.
  std::string dir = clip_folder({{"a", 0}, {"b</w>", 1000000000000000LL}});
  std::string message = load_error([&] { ClipTokenizer::from_folder(dir); });
  EXPECT_CONTAINS(message, dir + "/vocab.json");
  EXPECT_CONTAINS(message, "is 1000000000000000, outside [0, 1]");

  dir = clip_folder(kMiniClipVocab, R"({"model_max_length": 100000000})");
  EXPECT_CONTAINS(load_error([&] { ClipTokenizer::from_folder(dir); }), "model_max_length is 100000000");

  // extra_ids appends that many pieces (T5 tokenizer.json without added tokens is read like spiece.model).
  dir = dp::test::temp_dir("t5");
  dp::test::write_file(dir + "/tokenizer.json",
                       R"({"model": {"type": "Unigram", "vocab": [["<pad>", 0], ["</s>", 0], ["<unk>", 0]]}})");
  dp::test::write_file(dir + "/tokenizer_config.json", R"({"extra_ids": 1000000000000})");
  message = load_error([&] { T5Tokenizer::from_folder(dir); });
  EXPECT_CONTAINS(message, dir + "/tokenizer_config.json");
  EXPECT_CONTAINS(message, "extra_ids is 1000000000000, outside [0, 10000]");
}

TEST(Tokenizers, EmptyAddedTokensAreRefused) {
  // An empty special token matches at every position without advancing: encode looped forever.
  const std::string dir = clip_folder({{"", 0}, {"a", 1}, {"b</w>", 2}, {"ab</w>", 3}, {"<|endoftext|>", 4}},
                                      R"({"bos_token": ""})");
  EXPECT_CONTAINS(load_error([&] { ClipTokenizer::from_folder(dir).encode("a"); }), "bos_token must not be empty");
}

TEST(Unicode, NfcComposesAndReorders) {
  using unicode::decode_utf8;
  using unicode::nfc;
  EXPECT_EQ(nfc(U"e\u0301"), U"\u00e9");
  EXPECT_EQ(nfc(U"\u212b"), U"\u00c5");                 // singleton
  EXPECT_EQ(nfc(U"a\u0323\u0302"), U"\u1ead");          // reordered marks compose
  EXPECT_EQ(nfc(U"\u1100\u1161\u11a8"), U"\uac01");     // Hangul LVT
  EXPECT_EQ(nfc(U"\u0915\u093c"), U"\u0915\u093c");     // composition exclusion stays decomposed
  EXPECT_EQ(decode_utf8("caf\xC3\xA9", "t"), U"caf\u00e9");
}

}  // namespace
}  // namespace dp::tokenizers
