#include "tokenizers/added_tokens.h"

namespace dp::tokenizers {

void encode_around_added_tokens(const std::string& text, const std::vector<RawAddedToken>& tokens,
                                const std::function<void(const std::string& plain)>& encode_plain,
                                std::vector<int64_t>& ids) {
  size_t start = 0, pos = 0;
  while (pos < text.size()) {
    const RawAddedToken* match = nullptr;
    for (const auto& token : tokens) {
      if (text.compare(pos, token.content.size(), token.content) == 0 &&
          (match == nullptr || token.content.size() > match->content.size())) {
        match = &token;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    encode_plain(text.substr(start, pos - start));
    ids.push_back(match->id);
    pos += match->content.size();
    start = pos;
  }
  encode_plain(text.substr(start));
}

}  // namespace dp::tokenizers
