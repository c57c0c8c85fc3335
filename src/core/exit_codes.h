#pragma once
// The exit statuses every diffpipe command returns, one table for the README, --help and the batch scripts:
//
//   0   done
//   1   runtime: the work started and failed (a rank died, out of memory mid-run, a write failed)
//   2   usage: the command line cannot be parsed (unknown command or option, a missing required option, a
//       value of the wrong type, words no option takes)
//   3   input: the request was refused before any work (a model folder, checkpoint, prompts file or config
//       that is missing or invalid, a value out of range, more memory than the device has)
//   75  preempted (EX_TEMPFAIL): stopped by SIGUSR1/SIGTERM after writing a checkpoint; requeue with --resume
//
// Input and runtime errors are both dp::Error: which one a failure is follows from when it happens. A command
// validates everything first (the project's rule), then calls mark_work_started() before the expensive part.
#include <string>

#include "core/error.h"

namespace dp {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntimeError = 1;
inline constexpr int kExitUsageError = 2;
inline constexpr int kExitInputError = 3;
inline constexpr int kExitPreempted = 75;

// A command line that cannot mean anything (words no option takes): exit 2 like a parse error.
class UsageError : public Error {
 public:
  using Error::Error;
};

// From here on a failure is a runtime error (exit 1); before, an input error (exit 3).
void mark_work_started();
bool work_started();

// The status for a failure (not a usage error) caught now.
int failure_exit_code();

}  // namespace dp

#define DP_USAGE_FAIL(...) throw ::dp::UsageError(::dp::str(__VA_ARGS__), __FILE__, __LINE__)
