#pragma once
// Per-prompt LoRA choices: a prompt (a --prompt, or a --prompts-file line) may start with tags naming the adapters
// it uses, in the spelling many FLUX front-ends use:
//
//   <lora:style> <lora:detail:0.4> a lighthouse at dusk     style at its --lora scale, detail at 0.4, nothing else
//   <lora:none> a lighthouse at dusk                         no adapter for this prompt
//   a lighthouse at dusk                                     every adapter at its --lora scale (the default)
//
// Tags come first, separated by spaces; the rest of the line is the prompt. Choosing adapters per prompt needs
// --lora-mode unfused (fused mode merges one choice into the weights).
#include <cstdint>
#include <string>
#include <vector>

#include "io/lora_file.h"

namespace dp::pipeline {

struct PromptAdapters {
  std::vector<std::string> texts;          // the prompts without their tags
  std::vector<int64_t> choice_per_prompt;  // index into `choices`
  // Distinct choices, each a weight per adapter (0: off); choices[0] is the default, every adapter at its scale.
  std::vector<std::vector<double>> choices;
  bool any_tagged = false;
};

// Splits each prompt's leading tags from its text. Throws naming the prompt for an unknown adapter name, a
// malformed tag, a tag without any --lora, or a prompt left empty.
PromptAdapters parse_prompt_adapters(const std::vector<std::string>& prompts, const std::vector<io::LoraSpec>& specs);

}  // namespace dp::pipeline
