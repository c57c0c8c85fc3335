#pragma once
// The CUDA driver and the GPU's primary context, started before main().
//
// A `generate` on a GPU spends its first 0.3-0.5 s in the dynamic loader running LibTorch's static initialisers
// (bench/RESULTS.md, 2026-12-05), one core busy and the GPU idle; after main() it then waits for cuInit and the
// primary context. Linked into diffpipe-torch as a shared library of its own, whose constructor runs first of
// all the libraries' initialisers (-z initfirst), this loads the driver and runs cuInit there, in order with the
// loader's work (anything that may load a library stays on the loader's thread), and creates the primary
// context on a thread of its own while LibTorch initialises: the CUDA runtime later finds the context made.
//
// Measured on an H100: the context ready about 0.2 s after the process started, main() to the run 0.04-0.08 s
// instead of 0.20 s, 0.12 s less from command to PNG (bench/RESULTS.md, 2026-12-05, session 4).
// DIFFPIPE_EARLY_CUDA=0 turns it off. It starts only when the command line asks for `generate` without `--device cpu` (nor --help, --dry-run), in
// a process that is alone (no launcher environment) or launched by Open MPI's mpirun, whose local rank names
// the device: the device the runtime will pick (runtime::rank_device: local rank modulo the visible devices).
// It dlopens the driver, so a machine without one runs as before. This library needs neither LibTorch nor MPI.
#include <chrono>
#include <string>

namespace dp::cli {

// What the early start did, once its thread has finished (wait_for_early_cuda).
struct EarlyCudaStart {
  bool attempted = false;       // the command line and environment asked for it
  bool context = false;         // the primary context of `device` is made and retained
  int device = -1;              // the driver's ordinal among the visible devices
  std::chrono::steady_clock::time_point began;  // when the constructor began loading the driver
  double seconds = 0;           // the driver's load and cuInit (before the thread) and the primary context
  std::string outcome;          // what happened, for the log ("" when not attempted)
};

// Waits for the early thread (it runs only the driver's own initialisation) and says what it did. Idempotent.
EarlyCudaStart wait_for_early_cuda();

// Drops the early start's hold on the context, for a run that turned out to use another device or the CPU (a
// run config's `device: cpu`, a rank whose device the launcher did not say): the driver destroys a primary
// context no one else holds, so no GPU keeps memory for a context it does not use.
void release_early_cuda();

// The decision alone, from a command line and an environment lookup, for the tests: the device ordinal to
// start (local rank, before the modulo), or -1 with `why` saying why not.
int early_cuda_device(int argc, const char* const* argv, const char* (*getenv)(const char*), std::string* why);

}  // namespace dp::cli
