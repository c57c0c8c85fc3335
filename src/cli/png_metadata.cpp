#include "cli/png_metadata.h"

#include <sstream>

#include "core/error.h"

#ifndef DP_PROJECT_VERSION
#error "DP_PROJECT_VERSION must be defined by the build (the project's VERSION)"
#endif

namespace dp::cli {
namespace {

// Shortest decimal that reads back as the same double (3.5, not 3.500000).
std::string number(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  std::string text = out.str();
  for (int precision = 1; precision <= 17; ++precision) {
    std::ostringstream shorter;
    shorter.precision(precision);
    shorter << value;
    if (std::stod(shorter.str()) == value) return shorter.str();
  }
  return text;
}

}  // namespace

std::string diffpipe_version_string() { return str("diffpipe ", DP_PROJECT_VERSION); }

std::vector<io::PngText> png_text_for(const ImageSettings& image) {
  const std::string size = str(image.width, "x", image.height);
  std::string parameters = image.prompt;
  if (!image.negative_prompt.empty()) parameters += "\nNegative prompt: " + image.negative_prompt;
  parameters += str("\nSteps: ", image.steps, ", Guidance: ", number(image.guidance), ", Seed: ", image.seed,
                    ", Size: ", size, ", Model: ", image.model, ", Dtype: ", image.dtype, ", Batch index: ",
                    image.image_index, " of ", image.batch);
  if (!image.negative_prompt.empty()) parameters += str(", True CFG scale: ", number(image.true_cfg_scale));
  parameters += ", Version: " + diffpipe_version_string();
  std::vector<io::PngText> text = {{"parameters", parameters},
                                   {"prompt", image.prompt},
                                   {"seed", std::to_string(image.seed)},
                                   {"steps", std::to_string(image.steps)},
                                   {"guidance", number(image.guidance)},
                                   {"size", size},
                                   {"width", std::to_string(image.width)},
                                   {"height", std::to_string(image.height)},
                                   {"model", image.model},
                                   {"dtype", image.dtype},
                                   {"batch_index", std::to_string(image.image_index)},
                                   {"batch_size", std::to_string(image.batch)},
                                   {"Software", diffpipe_version_string()}};
  if (!image.negative_prompt.empty()) {
    text.push_back({"negative_prompt", image.negative_prompt});
    text.push_back({"true_cfg_scale", number(image.true_cfg_scale)});
  }
  return text;
}

}  // namespace dp::cli
