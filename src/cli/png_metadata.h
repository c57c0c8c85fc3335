#pragma once
// What generate writes into every PNG it makes: the settings that made the image, as text chunks other tools
// read. "parameters" is the one-block form other image generators write (the prompt, then "Key: value"
// pairs), and each setting also has a key of its own for scripts.
#include <cstdint>
#include <string>
#include <vector>

#include "io/png_text.h"

namespace dp::cli {

struct ImageSettings {
  std::string prompt, negative_prompt;  // negative: empty unless true CFG ran
  uint64_t seed = 0;
  int64_t image_index = 0, batch = 1;  // the image's row in the batch the seed drew latents for
  int steps = 0;
  double guidance = 0, true_cfg_scale = 1;
  int64_t width = 0, height = 0;
  std::string model, dtype;
};

// The version string these chunks and `--version` name: "diffpipe X.Y.Z".
std::string diffpipe_version_string();
std::vector<io::PngText> png_text_for(const ImageSettings& image);

}  // namespace dp::cli
