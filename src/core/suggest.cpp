#include "core/suggest.h"

#include <algorithm>
#include <cctype>

namespace dp {
namespace {

char folded(char c) {
  if (c == '_') return '-';
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

int allowed_distance(size_t length) {
  const int by_length = length <= 4 ? 1 : length <= 8 ? 2 : 3;
  return std::max(1, std::min(by_length, static_cast<int>(length / 2)));
}

}  // namespace

int spelling_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  // Three rows of the dynamic-programming table: the swap rule looks two rows back.
  std::vector<int> before(m + 1), previous(m + 1), current(m + 1);
  for (size_t j = 0; j <= m; ++j) previous[j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    current[0] = static_cast<int>(i);
    for (size_t j = 1; j <= m; ++j) {
      const int cost = folded(a[i - 1]) == folded(b[j - 1]) ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && folded(a[i - 1]) == folded(b[j - 2]) && folded(a[i - 2]) == folded(b[j - 1]))
        current[j] = std::min(current[j], before[j - 2] + 1);
    }
    std::swap(before, previous);
    std::swap(previous, current);
  }
  return previous[m];
}

std::string closest_spelling(const std::string& word, const std::vector<std::string>& candidates) {
  std::string trimmed = word;
  while (!trimmed.empty() && trimmed.front() == '-') trimmed.erase(trimmed.begin());
  if (trimmed.empty()) return {};
  const int limit = allowed_distance(trimmed.size());
  std::string best;
  int best_distance = limit + 1;
  for (const auto& candidate : candidates) {
    const int d = spelling_distance(trimmed, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string best = closest_spelling(word, candidates);
  return best.empty() ? std::string() : " (did you mean '" + best + "'?)";
}

}  // namespace dp
