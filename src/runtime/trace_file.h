#pragma once
// generate --trace FILE: every rank's spans (core/trace.h) merged into one Chrome trace-event file on rank 0.
namespace dp::runtime {

struct RunContext;

// Starts recording on this rank when --trace is given (every rank; rank 0 checks the path first).
void start_trace(const RunContext& run);
// Collective, at the end of a run with --trace: measures each rank's clock against rank 0's (ping-pong, the
// shortest round trip of several), gathers the spans to rank 0 and writes the file there: one process ("pid")
// per rank, one thread ("tid") per stream, "M" metadata naming both, "X" complete events with ts and dur in
// microseconds on rank 0's clock, counted from the earliest event. Every wait is bounded by
// --transport-timeout. Does nothing without --trace.
void write_trace(const RunContext& run);

}  // namespace dp::runtime
