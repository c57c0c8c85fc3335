#pragma once
// What the tokenizer fuzz targets share: a scratch folder the input is written into as tokenizer files, the
// bundle format that packs several files into one input, and the checks an accepted tokenizer must pass.
//
// Bundle format (clip_tokenizer and t5_tokenizer targets): a line "#file NAME" starts each file, whose bytes
// run up to the newline before the next such line or to the end of the input. Names outside the target's
// list, and bytes before the first header, are ignored. The name "prompt" is not a file: its bytes are one
// more text to encode. tests/fuzz/make_corpus.py writes bundles the same way.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "fuzz_verdict.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"
#include "tokenizers/unicode.h"

namespace dp::fuzz {

[[noreturn]] inline void invariant_failed(const char* target, const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: accepted tokenizer breaks invariant: %s (%s)\n", target, what, detail.c_str());
  std::abort();
}

#define TOKENIZER_FUZZ_REQUIRE(target, cond, detail)                       \
  do {                                                                      \
    if (!(cond)) ::dp::fuzz::invariant_failed(target, #cond, (detail));     \
  } while (0)

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::abort();  // the harness itself is broken; never report this as a parser result
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

// One folder per process (tmpfs when available: each execution writes files), removed at exit.
class ScratchFolder {
 public:
  explicit ScratchFolder(const char* tag) {
    // The harness prints nothing per input: truncation warnings would flood the fuzzer's log.
    dp::log::set_level(dp::log::Level::off);
    const bool shm = std::filesystem::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0;
    std::string pattern = (shm ? std::string("/dev/shm") : std::filesystem::temp_directory_path().string()) + "/" +
                          tag + ".XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    dir_ = pattern;
  }
  ~ScratchFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  const std::filesystem::path& dir() const { return dir_; }
  // Leaves exactly `files` (name -> bytes) among `names` in the folder.
  void hold(const std::vector<std::string>& names, const std::map<std::string, std::string>& files) const {
    for (const auto& name : names) {
      const auto it = files.find(name);
      if (it != files.end()) {
        write_file(dir_ / name, it->second);
      } else {
        std::error_code ignored;
        std::filesystem::remove(dir_ / name, ignored);
      }
    }
  }

 private:
  std::filesystem::path dir_;
};

// Splits a bundle into name -> bytes (a repeated name keeps its last copy).
inline std::map<std::string, std::string> split_bundle(const std::string& input) {
  static const std::string kHeader = "#file ", kLineHeader = "\n" + kHeader;
  std::vector<size_t> headers;  // where each header line starts
  if (input.compare(0, kHeader.size(), kHeader) == 0) headers.push_back(0);
  for (size_t pos = input.find(kLineHeader); pos != std::string::npos; pos = input.find(kLineHeader, pos + 1)) {
    headers.push_back(pos + 1);
  }
  std::map<std::string, std::string> files;
  for (size_t i = 0; i < headers.size(); ++i) {
    const size_t name_start = headers[i] + kHeader.size();
    // The newline before the next header belongs to neither file.
    const size_t limit = i + 1 < headers.size() ? headers[i + 1] - 1 : input.size();
    const size_t name_end = std::min(input.find('\n', name_start), limit);
    files[input.substr(name_start, name_end - name_start)] =
        name_end < limit ? input.substr(name_end + 1, limit - name_end - 1) : std::string();
  }
  return files;
}

// Texts every accepted tokenizer must encode: plain, empty, whitespace runs, special-token look-alikes, and
// non-ASCII text the NFKC charsmap and CLIP's normalizer rewrite.
inline const std::vector<std::string>& fixed_prompts() {
  static const std::vector<std::string> prompts = {
      "a photo of a cat",
      "",
      "  several   spaces\tand\nlines  ",
      "<|startoftext|>a dog<|endoftext|><|endoftext|>",
      "</s><pad><unk><extra_id_0> sentinel <extra_id_99>",
      "Caf\xC3\xA9 \xEF\xAC\x81 \xEF\xBC\xA1\xEF\xBC\xA2 \xE6\x9D\xB1\xE4\xBA\xAC \xF0\x9F\x98\x80 e\xCC\x81",
      "it's THE 2nd   test!!! ...",
  };
  return prompts;
}

// The fixed texts, and the bundle's "prompt" when it is valid UTF-8 (an invalid one is rightly refused by
// encode, so it says nothing about the tokenizer files) and short: CLIP's BPE is quadratic in the length of a
// word, so a long fuzzed prompt would time out on the prompt, not on the files under test.
inline std::vector<std::string> prompts_to_encode(const std::map<std::string, std::string>& bundle) {
  std::vector<std::string> prompts = fixed_prompts();
  const auto prompt = bundle.find("prompt");
  if (prompt != bundle.end() && prompt->second.size() <= 1024) {
    try {
      dp::tokenizers::unicode::decode_utf8(prompt->second, "prompt");
      prompts.push_back(prompt->second);
    } catch (const dp::Error&) {
    }
  }
  return prompts;
}

// What FluxPipeline relies on: ids inside the vocabulary (they index the text encoder's embedding), the
// special ids where they belong, the padded length, and a decode of the ids for truncation warnings.
inline void check_encoding(const char* target, const dp::tokenizers::ClipTokenizer& tokenizer,
                           const std::string& prompt) {
  const std::vector<int64_t> ids = tokenizer.encode(prompt);
  TOKENIZER_FUZZ_REQUIRE(target, ids.size() >= 2 && ids.front() == tokenizer.bos_id() &&
                                     ids.back() == tokenizer.eos_id(), prompt);
  for (int64_t id : ids) TOKENIZER_FUZZ_REQUIRE(target, id >= 0 && id < tokenizer.vocab_size(), std::to_string(id));
  const std::vector<int64_t> padded = tokenizer.encode_padded(prompt);
  TOKENIZER_FUZZ_REQUIRE(target, padded.size() == static_cast<size_t>(tokenizer.model_max_length()), prompt);
  tokenizer.decode(ids);
}

inline void check_encoding(const char* target, const dp::tokenizers::T5Tokenizer& tokenizer,
                           const std::string& prompt) {
  const std::vector<int64_t> ids = tokenizer.encode(prompt);
  TOKENIZER_FUZZ_REQUIRE(target, !ids.empty() && ids.back() == tokenizer.eos_id(), prompt);
  for (int64_t id : ids) TOKENIZER_FUZZ_REQUIRE(target, id >= 0 && id < tokenizer.vocab_size(), std::to_string(id));
  // FluxPipeline pads T5 to max_sequence_length, not to model_max_length.
  TOKENIZER_FUZZ_REQUIRE(target, tokenizer.encode_padded(prompt, 16).size() == 16u, prompt);
  tokenizer.decode(ids);
}

// Loads the scratch folder; a dp::Error is a clean rejection. A tokenizer that loads must encode every
// prompt without throwing (they are valid UTF-8) and pass check_encoding; anything else aborts.
template <typename Tokenizer>
void load_and_encode(const char* target, const ScratchFolder& scratch, const std::vector<std::string>& prompts) {
  Tokenizer tokenizer;
  try {
    tokenizer = Tokenizer::from_folder(scratch.dir().string());
  } catch (const dp::Error&) {
    note_rejected();
    return;
  }
  for (const std::string& prompt : prompts) {
    try {
      check_encoding(target, tokenizer, prompt);
    } catch (const dp::Error& e) {
      invariant_failed(target, "an accepted tokenizer encodes valid UTF-8", e.what());
    }
  }
  note_accepted();
}

}  // namespace dp::fuzz
