#pragma once
// generate --trace FILE and --torch-profile FILE, kept beside generate's other options without growing
// generate_options.cpp.
#include <CLI/CLI.hpp>

#include "runtime/distributed_generate.h"

namespace dp::cli {

void add_trace_options(CLI::App& generate, runtime::RuntimeOptions& options);

}  // namespace dp::cli
