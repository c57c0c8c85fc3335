#include "pipeline/prompt_adapters.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace dp::pipeline {
namespace {

size_t skip_spaces(const std::string& s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return i;
}

}  // namespace

PromptAdapters parse_prompt_adapters(const std::vector<std::string>& prompts, const std::vector<io::LoraSpec>& specs) {
  PromptAdapters out;
  std::vector<double> defaults;
  for (const auto& s : specs) defaults.push_back(s.scale);
  out.choices.push_back(defaults);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::string& line = prompts[p];
    const auto where = [&] { return str("prompt ", p + 1, " (\"", line.substr(0, 60), line.size() > 60 ? "..." : "", "\")"); };
    std::vector<double> weights(specs.size(), 0.0);
    bool tagged = false, none = false;
    size_t i = skip_spaces(line, 0);
    while (line.compare(i, 6, "<lora:") == 0) {
      const size_t close = line.find('>', i);
      DP_CHECK(close != std::string::npos, where(), ": a <lora:...> tag is not closed with '>'");
      const std::string body = line.substr(i + 6, close - i - 6);
      DP_CHECK(!specs.empty(), where(), ": tag <lora:", body, "> names an adapter, but no --lora is given");
      tagged = true;
      std::string name = body;
      double scale = NAN;
      const size_t colon = body.find(':');
      if (colon != std::string::npos) {
        name = body.substr(0, colon);
        const std::string number = body.substr(colon + 1);
        char* end = nullptr;
        scale = std::strtod(number.c_str(), &end);
        DP_CHECK(!number.empty() && end != nullptr && *end == '\0' && std::isfinite(scale), where(), ": <lora:", body,
                 ">: the scale after the name must be a finite number");
      }
      if (name == "none") {
        DP_CHECK(colon == std::string::npos, where(), ": <lora:none> takes no scale");
        none = true;
      } else {
        const auto found = std::find_if(specs.begin(), specs.end(), [&](const io::LoraSpec& s) { return s.name == name; });
        if (found == specs.end()) {
          std::string names;
          for (const auto& s : specs) names += (names.empty() ? "" : ", ") + s.name;
          DP_FAIL(where(), ": <lora:", body, "> names no adapter of this run (adapters: ", names, ")");
        }
        const size_t a = static_cast<size_t>(found - specs.begin());
        weights[a] = std::isnan(scale) ? found->scale : scale;
      }
      i = skip_spaces(line, close + 1);
    }
    DP_CHECK(!(none && std::any_of(weights.begin(), weights.end(), [](double w) { return w != 0; })), where(),
             ": <lora:none> together with adapters");
    const std::string text = line.substr(i);
    DP_CHECK(text.find_first_not_of(" \t") != std::string::npos, where(), ": no prompt text after the <lora:...> tags");
    out.texts.push_back(tagged ? text : line);
    if (!tagged) weights = defaults;
    out.any_tagged = out.any_tagged || tagged;
    const auto known = std::find(out.choices.begin(), out.choices.end(), weights);
    out.choice_per_prompt.push_back(known - out.choices.begin());
    if (known == out.choices.end()) out.choices.push_back(weights);
  }
  return out;
}

}  // namespace dp::pipeline
