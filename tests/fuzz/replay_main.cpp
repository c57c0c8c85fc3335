// Corpus replayer for builds without libFuzzer (the regular g++ build): runs LLVMFuzzerTestOneInput over
// every file in the folders (or files) named on the command line, so CI exercises the committed corpus on
// every change even though only clang can build the real fuzzer. A finding aborts, as under libFuzzer.
// Beyond that, each seed must meet the outcome its name promises (fuzz_verdict.h): bad_* rejected, valid_*
// and quirk_* accepted. Inputs with other names (crash-*, regression-*: the fuzzer's findings) need only
// not abort. Every mismatch is listed, and any makes the replay exit 1.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_verdict.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

namespace {

// The verdict a seed's name asks for, or none when the name promises only "no finding".
dp::fuzz::Verdict expected_verdict(const std::string& name) {
  if (name.rfind("bad_", 0) == 0) return dp::fuzz::Verdict::rejected;
  if (name.rfind("valid_", 0) == 0 || name.rfind("quirk_", 0) == 0) return dp::fuzz::Verdict::accepted;
  return dp::fuzz::Verdict::none;
}

const char* verdict_name(dp::fuzz::Verdict verdict) {
  switch (verdict) {
    case dp::fuzz::Verdict::accepted: return "accepted";
    case dp::fuzz::Verdict::rejected: return "rejected";
    default: return "no verdict";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (fs::is_directory(arg)) {
      for (const auto& item : fs::directory_iterator(arg))
        if (item.is_regular_file()) inputs.push_back(item.path());
    } else if (fs::is_regular_file(arg)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s is neither a file nor a folder\n", arg.c_str());
      return 2;
    }
  }
  // An empty run would pass silently if the corpus path were wrong; treat it as a failure instead.
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...  (no inputs found)\n", argv[0]);
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());  // stable order, so a failing input is easy to spot in logs
  std::vector<std::string> mismatches;
  size_t rejected = 0, accepted = 0;
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
      return 2;
    }
    const std::string name = path.filename().string();
    dp::fuzz::last_verdict() = dp::fuzz::Verdict::none;
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const dp::fuzz::Verdict got = dp::fuzz::last_verdict(), want = expected_verdict(name);
    if (got == dp::fuzz::Verdict::rejected) ++rejected;
    if (got == dp::fuzz::Verdict::accepted) ++accepted;
    std::string problem;
    if (got == dp::fuzz::Verdict::none)
      problem = "the harness reported neither acceptance nor rejection";
    else if (want != dp::fuzz::Verdict::none && got != want)
      problem = std::string(verdict_name(got)) + ", but its name asks for " + verdict_name(want);
    std::fprintf(stderr, "replay: %s (%zu bytes): %s%s\n", name.c_str(), bytes.size(), verdict_name(got),
                 problem.empty() ? "" : "  <- MISMATCH");
    if (!problem.empty()) mismatches.push_back(name + ": " + problem);
  }
  if (!mismatches.empty()) {
    std::fprintf(stderr, "replay: %zu of %zu inputs did not meet the outcome their name promises:\n",
                 mismatches.size(), inputs.size());
    for (const auto& m : mismatches) std::fprintf(stderr, "  %s\n", m.c_str());
    return 1;
  }
  std::printf("replay: %zu inputs, no findings; %zu rejected and %zu accepted, each as its name says\n",
              inputs.size(), rejected, accepted);
  return 0;
}
