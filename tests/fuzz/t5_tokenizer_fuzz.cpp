// libFuzzer target over the T5 tokenizer.json path (dp::tokenizers::T5Tokenizer::from_folder): the input is a
// bundle (tokenizer_fuzz_support.h) of tokenizer.json and tokenizer_config.json, plus an optional prompt. The
// interesting part is the Precompiled normalizer's charsmap, a binary darts-clone trie inside base64.
//
// A dp::Error from loading is a clean rejection. A tokenizer that loads must then encode every valid UTF-8
// text without throwing, give ids inside its vocabulary with eos last, pad to the requested length, and
// decode its own ids; anything else aborts, which libFuzzer reports.
#include <string>
#include <vector>

#include "tokenizer_fuzz_support.h"
#include "tokenizers/t5_tokenizer.h"

namespace {

constexpr char kTarget[] = "t5_tokenizer_fuzz";
const std::vector<std::string> kFiles = {"tokenizer.json", "tokenizer_config.json"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dp::fuzz::ScratchFolder scratch("dp_t5_tokenizer_fuzz");
  const auto files = dp::fuzz::split_bundle(std::string(reinterpret_cast<const char*>(data), size));
  scratch.hold(kFiles, files);
  dp::fuzz::load_and_encode<dp::tokenizers::T5Tokenizer>(kTarget, scratch, dp::fuzz::prompts_to_encode(files));
  return 0;
}

#ifdef DP_WITH_LIBFUZZER
// Structure-aware mutation. Byte mutations of base64 text rarely make a trie that gets past the size checks,
// so half of the time the charsmap is decoded, its bytes mutated, and the result encoded back in place. The
// other half stays plain byte mutation, which fuzzes the JSON and the base64 reader.
#include <algorithm>
#include <cstring>

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string decode_leniently(const std::string& text) {
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char ch : text) {
    const char* at = std::strchr(kAlphabet, ch);
    if (ch == '\0' || at == nullptr) continue;
    buffer = ((buffer << 6) | static_cast<uint32_t>(at - kAlphabet)) & 0xFFFFFF;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  return out;
}

std::string encode(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t group = 0;
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    for (size_t k = 0; k < 3; ++k) {
      group = (group << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    }
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  static const std::string kKey = "\"precompiled_charsmap\"";
  const std::string input(reinterpret_cast<const char*>(data), size);
  // The string value after the key, however the JSON was spaced.
  const size_t key = input.find(kKey);
  const size_t quote = key == std::string::npos ? key : input.find('"', key + kKey.size());
  const size_t begin = quote == std::string::npos ? quote : quote + 1;
  const size_t end = begin == std::string::npos ? begin : input.find('"', begin);
  if (seed % 2 == 0 || end == std::string::npos) return LLVMFuzzerMutate(data, size, max_size);

  std::string blob = decode_leniently(input.substr(begin, end - begin));
  const size_t room = blob.size() + 64;
  blob.resize(room);
  blob.resize(LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(blob.data()), room - 64, room));
  const std::string mutated = input.substr(0, begin) + encode(blob) + input.substr(end);
  if (mutated.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, mutated.data(), mutated.size());
  return mutated.size();
}
#endif
