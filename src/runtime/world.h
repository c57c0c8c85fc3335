#pragma once
// The MPI world of a run: which rank this process is, how many there are, which GPU of its node it uses.
// Rank 0 coordinates. A process not started by a launcher (no mpirun/srun environment) is a world of one and
// never initialises MPI.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dp::runtime {

class World {
 public:
  // Initialises MPI (MPI_Init_thread, funneled) when a launcher started this process, and checks that the
  // world is the size the launcher meant: srun without PMI starts N singletons, each alone in its world.
  static World& init(int* argc, char*** argv);
  static World& get();  // after init()
  ~World();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the ranks of this node (MPI_COMM_TYPE_SHARED)
  int local_size() const { return local_size_; }
  bool is_coordinator() const { return rank_ == 0; }
  bool uses_mpi() const { return uses_mpi_; }
  const std::string& host() const { return host_; }

  // Every rank passes its value of `what` (a build id, a model fingerprint, a plan hash); throws on every rank
  // when they differ, naming each distinct value and the ranks that hold it. Waits at most timeout_seconds
  // for the others, and on rank 0 stops early when a rank reports a failure.
  void agree(const std::string& what, const std::string& value, double timeout_seconds) const;
  // Rank 0's `value` on every rank (a broadcast), waiting at most timeout_seconds; rank 0 stops early when a
  // rank reports a failure.
  int share_from_coordinator(int value, double timeout_seconds) const;
  std::string share_text_from_coordinator(const std::string& value, const std::string& what, double timeout_seconds) const;
  // Every rank's `value` on rank 0, in rank order (others get an empty list), waiting at most timeout_seconds.
  std::vector<std::string> gather_to_coordinator(const std::string& value, const std::string& what,
                                                 double timeout_seconds) const;
  // Runs `work`; in a world of several ranks a failure anywhere ends the job on every rank, non-zero, with
  // the coordinator's log naming the failed rank and why. In a world of one the exception propagates.
  void run_guarded(const std::function<void()>& work) const;
  // Each rank's steady clock against rank 0's, for merging timelines (--trace): on rank 0, for every rank, the
  // offset to subtract from its microsecond times and the round trip that bounds the offset's error (rank 0:
  // zero); other ranks get an empty list. Ping-pongs with rank 0 on a communicator of its own, keeping the
  // shortest round trip of several; every wait at most timeout_seconds.
  struct ClockOffset {
    double offset_us = 0, round_trip_us = 0;
  };
  std::vector<ClockOffset> clock_offsets_to_coordinator(double timeout_seconds) const;
  // MPI, LibTorch-independent versions for the start-up log.
  std::string mpi_version() const;

  // Ends the whole job now (MPI_Abort when MPI runs, _exit otherwise).
  [[noreturn]] void abort(int code) const;
  // Ends this process once its command has ended, closed every file it writes, and, after an error, said why:
  // MPI finalised (mpirun then sees a clean end), stdout and stderr flushed, then _Exit(code), skipping the
  // destructors and exit handlers of LibTorch, CUDA and their caching allocators. After a success their teardown
  // is time the user waits for (bench/RESULTS.md); after an error it may run while a background thread still uses
  // CUDA, and crash. With DIFFPIPE_FULL_TEARDOWN=1 in the environment it returns instead, and the process ends the
  // usual way (for tools that inspect the teardown, such as leak checkers).
  static void end_process(int code);

 private:
  World() = default;
  bool uses_mpi_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
};

// The world size a launcher announced in the environment (OMPI_COMM_WORLD_SIZE, PMIX_SIZE, PMI_SIZE,
// SLURM_NTASKS for srun steps), or 0 when no launcher is seen.
int launcher_world_size();

}  // namespace dp::runtime
