#include "cli/inspect_png.h"

#include <iostream>
#include <nlohmann/json.hpp>

#include "io/png_text.h"

namespace dp::cli {

void inspect_png(const std::string& path, bool as_json) {
  const auto texts = io::read_png_text(path);
  if (as_json) {
    nlohmann::ordered_json report = {{"file", path}, {"text", nlohmann::ordered_json::object()},
                                     {"chunks", nlohmann::ordered_json::array()}};
    for (const auto& t : texts) {
      // A key repeated keeps its first value in "text", as PIL does; "chunks" lists every one.
      if (!t.compressed && !report["text"].contains(t.key)) report["text"][t.key] = t.value;
      report["chunks"].push_back({{"key", t.key}, {"type", t.international ? "iTXt" : t.compressed ? "zTXt" : "tEXt"},
                                  {"compressed", t.compressed}, {"value", t.value}});
    }
    std::cout << report.dump(2) << "\n";
    return;
  }
  std::cout << path << ": " << texts.size() << " text chunk(s)\n";
  for (const auto& t : texts) {
    if (t.compressed) {
      std::cout << t.key << ": (compressed, not shown)\n";
      continue;
    }
    // Multi-line values (the "parameters" block) are indented under their key.
    std::cout << t.key << ":";
    std::string line;
    bool first = true;
    for (size_t start = 0; start <= t.value.size();) {
      const size_t end = t.value.find('\n', start);
      line = t.value.substr(start, end == std::string::npos ? std::string::npos : end - start);
      std::cout << (first ? " " : "\n  ") << line;
      first = false;
      if (end == std::string::npos) break;
      start = end + 1;
    }
    std::cout << "\n";
  }
}

}  // namespace dp::cli
