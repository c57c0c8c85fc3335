// dp::Error's "[file:line]" suffix: project-relative however deep the clone lives, even under a folder that
// is itself named src (the top-level CMakeLists.txt maps the source root away with -fmacro-prefix-map).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace dp {
namespace {

TEST(Error, NamesTheProjectRelativeFileAndLine) {
  const int line = __LINE__ + 2;
  try {
    DP_FAIL("the value ", 42, " is wrong");
  } catch (const Error& e) {
    EXPECT_STREQ(e.file(), "tests/unit/core_error_test.cpp");
    EXPECT_EQ(e.line(), line);
    EXPECT_EQ(std::string(e.what()), "the value 42 is wrong [tests/unit/core_error_test.cpp:" + std::to_string(line) + "]");
    return;
  }
  ADD_FAILURE() << "DP_FAIL did not throw";
}

TEST(Error, KeepsAPathThatHasSrcInItAsGiven) {
  // What __FILE__ is for src/io/png_image.cpp; stripping at the first "src/" turned a clone in ~/src/diffpipe
  // into "src/diffpipe/src/io/png_image.cpp".
  try {
    throw_error("src/io/png_image.cpp", 7, nullptr, "bad");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "bad [src/io/png_image.cpp:7]");
  }
  try {
    throw_error("tests/unit/src/x.cpp", 3, "a == b", "");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "check failed: a == b [tests/unit/src/x.cpp:3]");
  }
}

}  // namespace
}  // namespace dp
