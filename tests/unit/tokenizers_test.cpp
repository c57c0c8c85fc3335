// CLIP and T5 tokenizers against transformers (tests/reference/cases_tokenizers.py): every corpus prompt
// must give exactly transformers' ids, padded and untruncated, from every folder layout.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "core/json_file.h"
#include "tokenizers/clip_tokenizer.h"
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
