#pragma once
// Added (special) tokens matched in the raw text, before a tokenizer's own normalization and splitting: CLIP's
// whose "normalized" flag is false, every one of T5's.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dp::tokenizers {

// An entry of tokenizer.json's "added_tokens" as CLIP keeps it: whether it is matched before normalization
// (normalized false) or after.
struct AddedToken {
  std::string content;
  int64_t id;  // an id of the vocabulary: encode emits it, decode looks it up
  bool normalized;
};

struct RawAddedToken {
  std::string content;  // non-empty: the loaders refuse empty contents
  int64_t id;
};

// Cuts `text` at the added tokens, matched leftmost and, of those starting at one place, longest (the first
// listed among equally long ones). In text order, hands each stretch between them (possibly empty) to
// `encode_plain` and appends each token's id to `ids`; `encode_plain` appends the stretch's ids to `ids` too.
void encode_around_added_tokens(const std::string& text, const std::vector<RawAddedToken>& tokens,
                                const std::function<void(const std::string& plain)>& encode_plain,
                                std::vector<int64_t>& ids);

}  // namespace dp::tokenizers
