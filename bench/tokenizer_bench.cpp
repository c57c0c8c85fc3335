// How long FLUX's two tokenizers take to load and to encode a prompt, the way encode_clip_pooled and encode_t5
// use them (from_folder, then encode_padded at 77 and at 512 tokens). Prints one JSON object per folder on
// stdout, for bench/tokenizer_load.py to set beside transformers' figures; the ids go with it, so that the
// script can check them against transformers at full vocabulary size.
//   tokenizer_bench CLIP_FOLDER T5_FOLDER PROMPT [--repeat N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace {

double seconds_of(const std::function<void()>& work) {
  const auto started = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The process's first load and encode (what a run pays: any one-time set-up included), then the median of
// `repeat` more of each.
template <typename Tokenizer>
nlohmann::json measure(const std::string& folder, const std::string& prompt, int max_length, int repeat) {
  std::vector<int64_t> ids;
  std::optional<Tokenizer> tokenizer;
  const double first_load = seconds_of([&] { tokenizer.emplace(Tokenizer::from_folder(folder)); });
  const double first_encode = seconds_of([&] { ids = tokenizer->encode_padded(prompt, max_length); });
  std::vector<double> loads, encodes;
  for (int r = 0; r < repeat; ++r) {
    loads.push_back(seconds_of([&] { tokenizer.emplace(Tokenizer::from_folder(folder)); }));
    encodes.push_back(seconds_of([&] { ids = tokenizer->encode_padded(prompt, max_length); }));
  }
  return {{"folder", folder},         {"first_load_s", first_load}, {"first_encode_s", first_encode},
          {"load_s", median(loads)}, {"encode_s", median(encodes)}, {"ids", ids}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tokenizer_bench CLIP_FOLDER T5_FOLDER PROMPT [--repeat N]\n");
    return 2;
  }
  int repeat = 5;
  if (argc >= 6 && std::string(argv[4]) == "--repeat") repeat = std::max(1, std::atoi(argv[5]));
  try {
    const nlohmann::json out = {
        {"clip", measure<dp::tokenizers::ClipTokenizer>(argv[1], argv[3], 77, repeat)},
        {"t5", measure<dp::tokenizers::T5Tokenizer>(argv[2], argv[3], 512, repeat)}};
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
