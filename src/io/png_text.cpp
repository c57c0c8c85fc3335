#include "io/png_text.h"

#include <array>
#include <cctype>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace dp::io {
namespace {

constexpr std::string_view kSignature("\x89PNG\r\n\x1a\n", 8);
// PNG caps a chunk's length at 2^31-1; anything larger is a corrupt or hostile file.
constexpr uint32_t kMaxChunkLength = 0x7fffffffu;
// A PNG of several GB is not an image this tool wrote or reads; refuse before reading it into memory.
constexpr std::uintmax_t kMaxFileBytes = uint64_t{1} << 30;

uint32_t crc32(std::string_view bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t big_endian32(std::string_view bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

// Latin-1 (tEXt's encoding) to UTF-8.
std::string latin1_to_utf8(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return out;
}

// Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF. Returns the offset of the first bad
// byte, or npos.
size_t first_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t length = 0;
    uint32_t min = 0, cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      length = 2, min = 0x80, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      length = 3, min = 0x800, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      length = 4, min = 0x10000, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + length > text.size()) return i;
    for (size_t k = 1; k < length; ++k) {
      const auto cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += length;
  }
  return std::string_view::npos;
}

struct ChunkPlace {
  const std::string& file;
  size_t index;
  size_t offset;
  std::string type;
};

std::ostream& operator<<(std::ostream& out, const ChunkPlace& p) {
  return out << p.file << ": chunk " << p.index << " (" << p.type << " at byte " << p.offset << ")";
}

// Splits "keyword\0rest", checking the keyword.
std::string_view take_keyword(std::string_view data, std::string_view& rest, const ChunkPlace& where) {
  const size_t nul = data.find('\0');
  DP_CHECK(nul != std::string_view::npos, where, ": no NUL after the keyword");
  const std::string_view key = data.substr(0, nul);
  DP_CHECK(valid_png_keyword(key), where, ": invalid keyword (1-79 printable Latin-1 characters expected)");
  rest = data.substr(nul + 1);
  return key;
}

PngText parse_text_chunk(const std::string& type, std::string_view data, const ChunkPlace& where) {
  PngText text;
  std::string_view rest;
  text.key = latin1_to_utf8(take_keyword(data, rest, where));
  if (type == "tEXt") {
    DP_CHECK(rest.find('\0') == std::string_view::npos, where, " \"", text.key, "\": NUL inside the text");
    text.value = latin1_to_utf8(rest);
  } else if (type == "zTXt") {
    DP_CHECK(!rest.empty() && rest[0] == 0, where, " \"", text.key, "\": unknown compression method");
    text.compressed = true;
  } else {  // iTXt: flag, method, language tag\0, translated keyword\0, text
    text.international = true;
    DP_CHECK(rest.size() >= 2, where, " \"", text.key, "\": truncated iTXt header");
    const auto flag = static_cast<unsigned char>(rest[0]);
    const auto method = static_cast<unsigned char>(rest[1]);
    DP_CHECK(flag <= 1 && method == 0, where, " \"", text.key, "\": invalid compression flag ", int(flag),
             " or method ", int(method));
    text.compressed = flag == 1;
    rest = rest.substr(2);
    const size_t language_end = rest.find('\0');
    DP_CHECK(language_end != std::string_view::npos, where, " \"", text.key, "\": no NUL after the language tag");
    const size_t translated_end = rest.find('\0', language_end + 1);
    DP_CHECK(translated_end != std::string_view::npos, where, " \"", text.key,
             "\": no NUL after the translated keyword");
    const std::string_view translated = rest.substr(language_end + 1, translated_end - language_end - 1);
    DP_CHECK(first_invalid_utf8(translated) == std::string_view::npos, where, " \"", text.key,
             "\": translated keyword is not UTF-8");
    const std::string_view value = rest.substr(translated_end + 1);
    if (!text.compressed) {
      const size_t bad = first_invalid_utf8(value);
      DP_CHECK(bad == std::string_view::npos, where, " \"", text.key, "\": text is not UTF-8 (byte ", bad, ")");
      text.value = std::string(value);
    }
  }
  return text;
}

}  // namespace

bool valid_png_keyword(std::string_view key) {
  if (key.empty() || key.size() > 79 || key.front() == ' ' || key.back() == ' ') return false;
  for (size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (!((c >= 32 && c <= 126) || c >= 161)) return false;
    if (c == ' ' && i > 0 && key[i - 1] == ' ') return false;
  }
  return true;
}

bool fits_png_text_chunk(std::string_view text) {
  for (unsigned char c : text)
    if (c == 0 || c >= 0x80) return false;
  return true;
}

std::vector<PngText> parse_png_text(std::string_view image, const std::string& name) {
  DP_CHECK(image.size() >= kSignature.size() && image.substr(0, kSignature.size()) == kSignature, name,
           ": not a PNG file (no PNG signature)");
  std::vector<PngText> texts;
  size_t offset = kSignature.size();
  bool ended = false;
  for (size_t index = 0; !ended; ++index) {
    DP_CHECK(offset < image.size(), name, ": ends after chunk ", index, " without an IEND chunk (truncated?)");
    DP_CHECK(image.size() - offset >= 12, name, ": chunk ", index, " at byte ", offset, ": truncated chunk header");
    const uint32_t length = big_endian32(image, offset);
    std::string type(image.substr(offset + 4, 4));
    ChunkPlace where{name, index, offset, ""};
    for (char& c : type)
      if (!std::isalpha(static_cast<unsigned char>(c))) c = '?';
    where.type = type;
    DP_CHECK(length <= kMaxChunkLength, where, ": length ", length, " over PNG's limit of 2^31-1");
    DP_CHECK(length <= image.size() - offset - 12, where, ": length ", length, " runs past the end of the file (",
             image.size() - offset - 12, " bytes left)");
    const std::string_view typed_data = image.substr(offset + 4, 4 + length);
    const uint32_t stored = big_endian32(image, offset + 8 + length);
    DP_CHECK(crc32(typed_data) == stored, where, ": CRC mismatch (stored ", stored, ", computed ", crc32(typed_data),
             "): the file is damaged");
    DP_CHECK(type.find('?') == std::string::npos, where, ": chunk type is not 4 ASCII letters");
    DP_CHECK((index == 0) == (type == "IHDR"), where, index == 0 ? ": the first chunk must be IHDR" : ": a second IHDR");
    if (type == "IHDR") DP_CHECK(length == 13, where, ": IHDR length ", length, ", expected 13");
    if (type == "tEXt" || type == "zTXt" || type == "iTXt")
      texts.push_back(parse_text_chunk(type, typed_data.substr(4), where));
    ended = type == "IEND";
    offset += 12 + static_cast<size_t>(length);
  }
  DP_CHECK(offset == image.size(), name, ": ", image.size() - offset, " bytes after the IEND chunk");
  return texts;
}

std::vector<PngText> read_png_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DP_CHECK(in.good(), path, ": cannot open");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uintmax_t>(in.tellg());
  DP_CHECK(size <= kMaxFileBytes, path, ": ", size, " bytes is too large for a PNG this tool reads (limit ",
           kMaxFileBytes, ")");
  in.seekg(0);
  std::string image(static_cast<size_t>(size), '\0');
  in.read(image.data(), static_cast<std::streamsize>(size));
  DP_CHECK(in.gcount() == static_cast<std::streamsize>(size), path, ": short read");
  return parse_png_text(image, path);
}

}  // namespace dp::io
