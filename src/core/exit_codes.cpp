#include "core/exit_codes.h"

#include <atomic>

namespace dp {
namespace {

// Set once by the command's thread; read by whichever thread reports a failure (the log, MPI's failure path).
std::atomic<bool> started{false};

}  // namespace

void mark_work_started() { started.store(true); }

bool work_started() { return started.load(); }

int failure_exit_code() { return work_started() ? kExitRuntimeError : kExitInputError; }

}  // namespace dp
