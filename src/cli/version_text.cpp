// diffpipe-torch's answer to --version (the front hands --version here: it links none of these libraries).
#include "cli/command.h"
#include "runtime/versions.h"

namespace dp::cli {
namespace {

const bool installed = [] {
  version_text() = [] { return runtime::version_report(); };
  return true;
}();

}  // namespace
}  // namespace dp::cli
