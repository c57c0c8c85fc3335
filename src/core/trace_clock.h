#pragma once
// The clock of --trace (core/trace.h) in fractions of a microsecond, for aligning ranks' clocks. The
// environment variable DIFFPIPE_TRACE_CLOCK_SKEW_US="us0,us1,..." shifts rank R's clock by usR (the launcher's
// rank variable picks the entry): tests give ranks on one host the unrelated clocks of separate hosts, so that
// the alignment has something to correct.
namespace dp::trace {

double now_us_fine();

}  // namespace dp::trace
