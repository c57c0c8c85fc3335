#pragma once
// How long this process has existed, for the part of a run no in-process timer sees: loading the shared
// libraries (LibTorch, CUDA) and their static initialisers before main(). The kernel records the start in
// clock ticks (10 ms on Linux), and exec keeps it, so `diffpipe` handing over to `diffpipe-torch` counts too.
namespace dp {

// Seconds since the kernel started this process (tick resolution); negative if /proc cannot be read.
double process_age_seconds();

// Called first thing in main(); age_at_main_seconds() then says how long the process took to get there.
void mark_main_entered();
double age_at_main_seconds();  // negative before mark_main_entered() or without /proc

}  // namespace dp
