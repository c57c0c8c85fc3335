// libFuzzer target over the PNG text reader (dp::io::parse_png_text), which `diffpipe inspect FILE.png` runs on
// images users pass around.
//
// Contract: reject with dp::Error, or return chunks that are safe to print: every key a valid PNG keyword,
// every value valid UTF-8 (tEXt's Latin-1 converted), compressed chunks with an empty value, and never more
// chunks than the file could hold (12 bytes each). Anything else aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "fuzz_verdict.h"
#include "io/png_text.h"

namespace {

[[noreturn]] void invariant_failed(const char* what) {
  std::fprintf(stderr, "png_text_fuzz: accepted file breaks invariant: %s\n", what);
  std::abort();
}

#define FUZZ_REQUIRE(cond)                 \
  do {                                     \
    if (!(cond)) invariant_failed(#cond);  \
  } while (0)

bool valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t length = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) return false;
    i += length;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view image(reinterpret_cast<const char*>(data), size);
  try {
    const auto texts = dp::io::parse_png_text(image, "fuzz.png");
    FUZZ_REQUIRE(texts.size() * 12 <= size);
    for (const auto& t : texts) {
      FUZZ_REQUIRE(!t.key.empty() && t.key.size() <= 2 * 79);  // Latin-1 keys grow when converted to UTF-8
      FUZZ_REQUIRE(valid_utf8(t.key));
      FUZZ_REQUIRE(valid_utf8(t.value));
      FUZZ_REQUIRE(!t.compressed || t.value.empty());
    }
    dp::fuzz::note_accepted();
  } catch (const dp::Error&) {
    dp::fuzz::note_rejected();
  }
  return 0;
}
