#include "core/error.h"

namespace dp {

// `file` is already project-relative ("src/io/png_image.cpp"): the top-level CMakeLists.txt maps the source
// root away with -fmacro-prefix-map, so nothing is stripped here (stripping at the first "src/" broke clones
// that live under a folder named src).
[[noreturn]] void throw_error(const char* file, int line, const char* condition, const std::string& message) {
  std::string text = message;
  if (condition != nullptr && message.empty()) text = str("check failed: ", condition);
  text += str(" [", file, ":", line, "]");
  throw Error(std::move(text), file, line);
}

}  // namespace dp
