#pragma once
#include <string>

namespace dp::cli {

// `inspect FILE.png`: the text chunks of a PNG (the prompt and settings generate stores), after the reader's
// checks (io/png_text.h); a damaged file fails naming the chunk.
void inspect_png(const std::string& path, bool as_json);

}  // namespace dp::cli
