#pragma once
// PNG text chunks (tEXt, iTXt): the prompt and settings an image was made with, as other generators store
// them. The reader parses files users pass around, so it trusts nothing: every chunk's length is checked
// against the file, every CRC verified, keywords and text validated. Torch-free and libpng-free, so that
// `diffpipe inspect` and the fuzz target read PNGs without either.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dp::io {

struct PngText {
  std::string key;    // 1 to 79 printable Latin-1 characters (PNG's keyword rule)
  std::string value;  // UTF-8 (tEXt's Latin-1 is converted)
  bool international = false;  // stored as iTXt (UTF-8) rather than tEXt (Latin-1)
  bool compressed = false;     // zTXt or compressed iTXt: listed, value left empty (not inflated)
};

// The text chunks of a whole PNG file image, in file order. Throws dp::Error naming `name` and the chunk
// (its index and offset) when the file is not a well-formed PNG: bad signature, IHDR not first, a length
// past the end of the file or over PNG's 2^31-1, a CRC mismatch, no IEND, bytes after IEND, an invalid
// keyword, a malformed iTXt header, or iTXt text that is not UTF-8.
std::vector<PngText> parse_png_text(std::string_view image, const std::string& name);
std::vector<PngText> read_png_text(const std::string& path);

// Keyword rule for writers: 1-79 characters, Latin-1 printable, no leading/trailing/double spaces.
bool valid_png_keyword(std::string_view key);
// Whether `text` can go in a tEXt chunk as it is (plain ASCII without NUL); else it needs iTXt.
bool fits_png_text_chunk(std::string_view text);

}  // namespace dp::io
