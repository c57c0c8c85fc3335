#pragma once
// "Did you mean": the known name closest to a misspelt one (config keys today, command-line flags next).
// Torch-free and allocation-light; the distance is the optimal-string-alignment one (insertions, deletions,
// substitutions and swaps of two neighbouring characters each cost 1), so "stpes" is one edit from "steps".
#include <string>
#include <vector>

namespace dp {

// Edits between `a` and `b`, compared case-insensitively with '_' and '-' treated as equal (device_map and
// device-map are the same key to a reader).
int spelling_distance(const std::string& a, const std::string& b);

// The candidate nearest to `word` when it is close enough to be a likely typo: within 1 edit for words of up
// to 4 characters, 2 up to 8, else 3, and never more than half the word. Ties go to the earlier candidate.
// Empty when none is close.
std::string closest_spelling(const std::string& word, const std::vector<std::string>& candidates);

// " (did you mean 'X'?)" for closest_spelling's answer, or "" when there is none.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace dp
