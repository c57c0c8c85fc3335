// libFuzzer target over the CLIP tokenizer files (dp::tokenizers::ClipTokenizer::from_folder): the input is a
// bundle (tokenizer_fuzz_support.h) of vocab.json, merges.txt, tokenizer.json, tokenizer_config.json and
// special_tokens_map.json, written into a scratch folder, plus an optional prompt.
//
// A dp::Error from loading is a clean rejection. A tokenizer that loads must then encode every valid UTF-8
// text without throwing, give ids inside its vocabulary with bos first and eos last, pad to its
// model_max_length, and decode its own ids; anything else aborts, which libFuzzer reports.
#include <string>
#include <vector>

#include "tokenizer_fuzz_support.h"
#include "tokenizers/clip_tokenizer.h"

namespace {

constexpr char kTarget[] = "clip_tokenizer_fuzz";
const std::vector<std::string> kFiles = {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                                         "special_tokens_map.json"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dp::fuzz::ScratchFolder scratch("dp_clip_tokenizer_fuzz");
  const auto files = dp::fuzz::split_bundle(std::string(reinterpret_cast<const char*>(data), size));
  scratch.hold(kFiles, files);
  dp::fuzz::load_and_encode<dp::tokenizers::ClipTokenizer>(kTarget, scratch, dp::fuzz::prompts_to_encode(files));
  return 0;
}
