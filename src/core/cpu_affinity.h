#pragma once
// How many CPUs this process may run on. A launcher may bind each rank to a few cores (Open MPI binds each rank
// to one core when it starts two or fewer; SLURM to its --cpus-per-task), and threads sized by the machine's
// count would then crowd onto them: on an H100 machine a rank bound to one core loaded weights at 5 GB/s where
// an unbound one read 35 (bench/RESULTS.md, 2026-12-07, session 19).
namespace dp {

// The CPUs in the calling thread's affinity mask (new threads inherit it), at least 1.
int usable_cpus();
// The CPUs online on this machine, at least 1.
int machine_cpus();

}  // namespace dp
