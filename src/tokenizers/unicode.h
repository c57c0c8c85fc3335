#pragma once
// The Unicode facts the CLIP and T5 tokenizers need, matching what the `tokenizers` library (Rust) does:
// UTF-8 decoding, Oniguruma's \p{L} / \p{N} / \s, Rust's char lowercasing and whitespace, NFC, and grapheme
// clusters (an approximation of UAX #29, enough for the sentencepiece normalizer's grapheme lookups).
// The tables come from tests/reference/unicode_tables.py, read off the pinned tokenizers library.
#include <string>
#include <vector>

namespace dp::tokenizers::unicode {

// Throws dp::Error naming `what` and the byte offset on invalid UTF-8.
std::u32string decode_utf8(const std::string& text, const std::string& what);
std::string encode_utf8(const std::u32string& text);
void append_utf8(char32_t c, std::string& out);

bool is_letter(char32_t c);       // \p{L}
bool is_number(char32_t c);       // \p{N}
bool is_regex_space(char32_t c);  // Oniguruma's \s in Unicode mode
bool is_rust_whitespace(char32_t c);  // char::is_whitespace (White_Space property)

// Rust's char::to_lowercase (full mapping, context free), appended to out.
void append_lowercase(char32_t c, std::u32string& out);
// Unicode Normalization Form C.
std::u32string nfc(const std::u32string& text);
// Extended grapheme clusters, approximately: a base followed by its marks/joiners, CR LF, flag pairs.
std::vector<std::u32string> graphemes(const std::u32string& text);

}  // namespace dp::tokenizers::unicode
