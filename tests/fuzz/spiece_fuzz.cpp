// libFuzzer target over the T5 spiece.model path (dp::tokenizers::T5Tokenizer::from_folder on a folder with
// only spiece.model): the input is the file itself, a serialized sentencepiece ModelProto. sentencepiece
// parses it first; our own protobuf wire reader then digs out normalizer_spec.precompiled_charsmap, and the
// charsmap's darts-clone trie is validated and used by encode.
//
// A dp::Error from loading is a clean rejection. A tokenizer that loads must then encode every valid UTF-8
// text without throwing, give ids inside its vocabulary with eos last, and decode its own ids; anything else
// aborts, which libFuzzer reports.
#include <string>
#include <vector>

#include "tokenizer_fuzz_support.h"
#include "tokenizers/t5_tokenizer.h"

namespace {

constexpr char kTarget[] = "spiece_fuzz";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dp::fuzz::ScratchFolder scratch("dp_spiece_fuzz");
  scratch.hold({"spiece.model"}, {{"spiece.model", std::string(reinterpret_cast<const char*>(data), size)}});
  dp::fuzz::load_and_encode<dp::tokenizers::T5Tokenizer>(kTarget, scratch, dp::fuzz::fixed_prompts());
  return 0;
}
