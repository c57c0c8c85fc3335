#include "core/error.h"

#include <cstring>

namespace dp {

[[noreturn]] void throw_error(const char* file, int line, const char* condition, const std::string& message) {
  // Strip the build directory prefix so messages stay short and stable across machines.
  const char* short_file = std::strstr(file, "src/");
  if (short_file == nullptr) short_file = file;
  std::string text = message;
  if (condition != nullptr && message.empty()) text = str("check failed: ", condition);
  text += str(" [", short_file, ":", line, "]");
  throw Error(std::move(text), short_file, line);
}

}  // namespace dp
