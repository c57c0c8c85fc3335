#pragma once
// What `diffpipe --version` prints: the build id every rank compares (version, git revision, build time), then
// the libraries it runs on, a "name: value" line each. Nothing here starts MPI or a GPU context; the GPU count
// comes from LibTorch's device query.
#include <string>

namespace dp::runtime {

std::string version_report();

}  // namespace dp::runtime
