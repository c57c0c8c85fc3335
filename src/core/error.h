#pragma once
// One error type and one check macro family for the whole project. Every failure carries the source
// location and a message built from the values that explain it (file, tensor name, rank, offending value).
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dp {

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line)
      : std::runtime_error(std::move(message)), file_(file), line_(line) {}
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  const char* file_;
  int line_;
};

// Concatenates anything streamable; used for messages because g++ 12 lacks std::format and fmt clashes
// between LibTorch and spdlog.
template <typename... Parts>
std::string str(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

[[noreturn]] void throw_error(const char* file, int line, const char* condition, const std::string& message);

}  // namespace dp

#define DP_FAIL(...) ::dp::throw_error(__FILE__, __LINE__, nullptr, ::dp::str(__VA_ARGS__))
#define DP_CHECK(cond, ...)                                                      \
  do {                                                                           \
    if (!(cond)) ::dp::throw_error(__FILE__, __LINE__, #cond, ::dp::str(__VA_ARGS__)); \
  } while (0)
#define DP_CHECK_EQ(a, b, ...) \
  DP_CHECK((a) == (b), __VA_ARGS__, " (", #a, " = ", (a), ", ", #b, " = ", (b), ")")
