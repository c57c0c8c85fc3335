#include "tokenizers/unicode.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "tokenizers/unicode_data.h"

namespace dp::tokenizers::unicode {
namespace {

using namespace dp::tokenizers::unicode_data;

template <size_t N>
bool in_ranges(const uint32_t (&ranges)[N], char32_t c) {
  // Ranges are sorted pairs; find the first range whose end is >= c.
  size_t lo = 0, hi = N / 2;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (ranges[2 * mid + 1] < c) lo = mid + 1; else hi = mid;
  }
  return lo < N / 2 && ranges[2 * lo] <= c;
}

// Hangul syllables decompose and compose algorithmically (Unicode 3.12).
constexpr char32_t kHangulBase = 0xAC00, kJamoL = 0x1100, kJamoV = 0x1161, kJamoT = 0x11A7;
constexpr int kCountV = 21, kCountT = 28, kCountN = kCountV * kCountT, kCountS = 11172;

struct NfcTables {
  std::unordered_map<char32_t, std::pair<char32_t, char32_t>> decomposition;
  std::unordered_map<uint64_t, char32_t> composition;
  NfcTables() {
    const size_t n = sizeof(kDecompositions) / sizeof(uint32_t) / 3;
    const auto* excluded_begin = std::begin(kCompositionExcluded);
    const auto* excluded_end = std::end(kCompositionExcluded);
    for (size_t i = 0; i < n; ++i) {
      const char32_t c = kDecompositions[3 * i], a = kDecompositions[3 * i + 1], b = kDecompositions[3 * i + 2];
      decomposition[c] = {a, b};
      if (b != 0 && !std::binary_search(excluded_begin, excluded_end, static_cast<uint32_t>(c))) {
        composition[(static_cast<uint64_t>(a) << 32) | b] = c;
      }
    }
  }
};

const NfcTables& nfc_tables() {
  static const NfcTables tables;
  return tables;
}

int combining_class(char32_t c) {
  const size_t n = sizeof(kCombiningClass) / sizeof(uint32_t) / 3;
  size_t lo = 0, hi = n;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (kCombiningClass[3 * mid + 1] < c) lo = mid + 1; else hi = mid;
  }
  return lo < n && kCombiningClass[3 * lo] <= c ? static_cast<int>(kCombiningClass[3 * lo + 2]) : 0;
}

void decompose(char32_t c, std::u32string& out) {
  if (c >= kHangulBase && c < kHangulBase + kCountS) {
    const int index = static_cast<int>(c - kHangulBase);
    out += static_cast<char32_t>(kJamoL + index / kCountN);
    out += static_cast<char32_t>(kJamoV + (index % kCountN) / kCountT);
    if (index % kCountT != 0) out += static_cast<char32_t>(kJamoT + index % kCountT);
    return;
  }
  const auto& table = nfc_tables().decomposition;
  const auto it = table.find(c);
  if (it == table.end()) {
    out += c;
    return;
  }
  decompose(it->second.first, out);
  if (it->second.second != 0) decompose(it->second.second, out);
}

// Returns 0 when the pair has no primary composite.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kJamoL && a < kJamoL + 19 && b >= kJamoV && b < kJamoV + kCountV) {
    return kHangulBase + ((a - kJamoL) * kCountV + (b - kJamoV)) * kCountT;
  }
  if (a >= kHangulBase && a < kHangulBase + kCountS && (a - kHangulBase) % kCountT == 0 && b > kJamoT &&
      b < kJamoT + kCountT) {
    return a + (b - kJamoT);
  }
  const auto& table = nfc_tables().composition;
  const auto it = table.find((static_cast<uint64_t>(a) << 32) | b);
  return it == table.end() ? 0 : it->second;
}

bool is_regional_indicator(char32_t c) { return c >= 0x1F1E6 && c <= 0x1F1FF; }
bool is_pictographic(char32_t c) { return (c >= 0x2600 && c <= 0x27BF) || (c >= 0x1F000 && c <= 0x1FAFF); }

}  // namespace

std::u32string decode_utf8(const std::string& text, const std::string& what) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    int length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    DP_CHECK(length > 0 && i + length <= text.size(), what, ": invalid UTF-8 at byte ", i);
    char32_t c = length == 1 ? lead : lead & (0x7F >> length);
    for (int k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      DP_CHECK((next & 0xC0) == 0x80, what, ": invalid UTF-8 at byte ", i + k);
      c = (c << 6) | (next & 0x3F);
    }
    const char32_t minimum[] = {0, 0, 0x80, 0x800, 0x10000};
    DP_CHECK(c >= minimum[length] && c <= 0x10FFFF && !(c >= 0xD800 && c < 0xE000), what,
             ": invalid UTF-8 (overlong, surrogate or out of range) at byte ", i);
    out += c;
    i += static_cast<size_t>(length);
  }
  return out;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string encode_utf8(const std::u32string& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(c, out);
  return out;
}

bool is_letter(char32_t c) { return in_ranges(kLetterRanges, c); }
bool is_number(char32_t c) { return in_ranges(kNumberRanges, c); }

bool is_regex_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The White_Space property is the same set as Oniguruma's \s.
bool is_rust_whitespace(char32_t c) { return is_regex_space(c); }

void append_lowercase(char32_t c, std::u32string& out) {
  const size_t n = sizeof(kLowercase) / sizeof(uint32_t) / 3;
  size_t lo = 0, hi = n;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (kLowercase[3 * mid] < c) lo = mid + 1; else hi = mid;
  }
  if (lo < n && kLowercase[3 * lo] == c) {
    out += static_cast<char32_t>(kLowercase[3 * lo + 1]);
    if (kLowercase[3 * lo + 2] != 0) out += static_cast<char32_t>(kLowercase[3 * lo + 2]);
  } else {
    out += c;
  }
}

std::u32string nfc(const std::u32string& text) {
  std::u32string d;
  d.reserve(text.size());
  for (char32_t c : text) decompose(c, d);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + static_cast<long>(i), d.begin() + static_cast<long>(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition (UAX #15): a char joins the last starter unless a char in between has a class
  // greater or equal to its own. 256 marks "no starter yet".
  if (d.empty()) return d;
  size_t starter = 0, written = 1;
  int last_class = combining_class(d[0]) == 0 ? 0 : 256;
  for (size_t i = 1; i < d.size(); ++i) {
    const char32_t c = d[i];
    const int klass = combining_class(c);
    const char32_t composite = last_class < klass || last_class == 0 ? compose(d[starter], c) : 0;
    if (composite != 0) {
      d[starter] = composite;
      continue;
    }
    if (klass == 0) starter = written;
    last_class = klass;
    d[written++] = c;
  }
  d.resize(written);
  return d;
}

std::vector<std::u32string> graphemes(const std::u32string& text) {
  std::vector<std::u32string> clusters;
  int regional_run = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    bool join = false;
    if (!clusters.empty()) {
      const char32_t prev = text[i - 1];
      join = (prev == '\r' && c == '\n') || (prev != '\r' && prev != '\n' && in_ranges(kGraphemeExtendRanges, c)) ||
             (prev == 0x200D && is_pictographic(c)) ||
             (is_regional_indicator(c) && is_regional_indicator(prev) && regional_run % 2 == 1);
    }
    regional_run = is_regional_indicator(c) ? regional_run + 1 : 0;
    if (join) clusters.back() += c; else clusters.emplace_back(1, c);
  }
  return clusters;
}

}  // namespace dp::tokenizers::unicode
