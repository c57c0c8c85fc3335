#include "runtime/world.h"

#include <c10/util/Exception.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/exit_codes.h"
#include "core/log.h"
#include "core/trace_clock.h"
#include "runtime/failure_channel.h"
#include "runtime/transport.h"

namespace dp::runtime {
namespace {

std::unique_ptr<World> g_world;

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  DP_FAIL(what, " failed: ", std::string(text, static_cast<size_t>(length)));
}

int env_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  return (end != nullptr && *end == '\0' && parsed > 0 && parsed < (1 << 20)) ? static_cast<int>(parsed) : 0;
}

}  // namespace

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"}) {
    if (int n = env_int(name)) return n;
  }
  // Inside an srun step (SLURM_STEP_ID set) every task is a rank; in a batch script alone it is not.
  if (std::getenv("SLURM_STEP_ID") != nullptr) return env_int("SLURM_NTASKS");
  return 0;
}

World& World::init(int* argc, char*** argv) {
  DP_CHECK(!g_world, "the MPI world is initialised twice");
  g_world.reset(new World());
  World& w = *g_world;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  w.host_ = host;
  const int announced = launcher_world_size();
  if (announced == 0) return w;  // a plain process: a world of one, no MPI
  // srun --mpi=none (or a SLURM whose MpiDefault is none) starts N tasks with no process-management
  // interface: Open MPI would abort inside MPI_Init with a message that does not say why. Say it here.
  const bool srun_step = std::getenv("SLURM_STEP_ID") != nullptr && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr;
  const bool has_pmi = std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr ||
                       std::getenv("PMI_FD") != nullptr;
  DP_CHECK(!(srun_step && !has_pmi && announced > 1), "srun started ", announced,
           " tasks without a process-management interface (no PMIx/PMI in the environment), so the ranks cannot "
           "find each other: run srun --mpi=pmix (Debian's Open MPI has no PMI-1/PMI-2), or set MpiDefault=pmix "
           "in slurm.conf, or start the ranks with mpirun inside the allocation");

  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  w.uses_mpi_ = true;
  // Errors come back as codes that check_mpi turns into exceptions with context, instead of aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &w.size_), "MPI_Comm_size");
  MPI_Comm local;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank_, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  MPI_Comm_rank(local, &w.local_rank_);
  MPI_Comm_size(local, &w.local_size_);
  MPI_Comm_free(&local);
  log::set_rank(w.rank_);
  DP_CHECK(w.size_ == announced, "this process is alone in an MPI world of ", w.size_, " while the launcher started ",
           announced, " tasks: the ranks did not find each other (srun needs --mpi=pmix with Debian's Open MPI; "
           "mpirun must be the Open MPI that diffpipe was built with)");
  return w;
}

World& World::get() {
  DP_CHECK(g_world != nullptr, "World::get() before World::init()");
  return *g_world;
}

World::~World() {
  int finalized = 0;
  if (uses_mpi_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
}

namespace {

// Waits for a non-blocking collective, watching for a rank's failure report, at most `timeout_seconds`.
void wait_collective(MPI_Request& request, int rank, const std::string& what, double timeout_seconds) {
  const auto started = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    throw_if_a_rank_failed(rank);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    DP_CHECK(waited < timeout_seconds, "rank ", rank, ": the ranks did not all reach the ", what, " check within ",
             timeout_seconds, " s (--transport-timeout): a rank is stuck, dead or unreachable");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

}  // namespace

void World::agree(const std::string& what, const std::string& value, double timeout_seconds) const {
  if (!uses_mpi_ || size_ == 1) return;
  const int length = static_cast<int>(value.size());
  std::vector<int> lengths(static_cast<size_t>(size_));
  MPI_Request request;
  check_mpi(MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD, &request),
            "MPI_Iallgather");
  wait_collective(request, rank_, what, timeout_seconds);
  std::vector<int> offsets(static_cast<size_t>(size_), 0);
  for (int r = 1; r < size_; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(static_cast<size_t>(offsets.back() + lengths.back()), '\0');
  check_mpi(MPI_Iallgatherv(value.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
                            MPI_COMM_WORLD, &request),
            "MPI_Iallgatherv");
  wait_collective(request, rank_, what, timeout_seconds);
  std::map<std::string, std::string> holders;  // value -> "0,2,3"
  for (int r = 0; r < size_; ++r) {
    auto& ranks = holders[all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lengths[r]))];
    ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  }
  if (holders.size() == 1) return;
  std::string detail;
  for (const auto& [v, ranks] : holders) detail += "\n  ranks " + ranks + ": " + v;
  DP_FAIL("the ranks disagree on the ", what, ":", detail);
}

int World::share_from_coordinator(int value, double timeout_seconds) const {
  if (!uses_mpi_ || size_ == 1) return value;
  MPI_Request request;
  check_mpi(MPI_Ibcast(&value, 1, MPI_INT, 0, MPI_COMM_WORLD, &request), "MPI_Ibcast");
  wait_collective(request, rank_, "end-of-denoising status", timeout_seconds);
  return value;
}

std::string World::share_text_from_coordinator(const std::string& value, const std::string& what,
                                               double timeout_seconds) const {
  if (!uses_mpi_ || size_ == 1) return value;
  int length = static_cast<int>(value.size());
  MPI_Request request;
  check_mpi(MPI_Ibcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD, &request), "MPI_Ibcast");
  wait_collective(request, rank_, what, timeout_seconds);
  std::string shared = is_coordinator() ? value : std::string(static_cast<size_t>(length), '\0');
  check_mpi(MPI_Ibcast(shared.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD, &request), "MPI_Ibcast");
  wait_collective(request, rank_, what, timeout_seconds);
  return shared;
}

std::vector<std::string> World::gather_to_coordinator(const std::string& value, const std::string& what,
                                                      double timeout_seconds) const {
  if (!uses_mpi_ || size_ == 1) return {value};
  DP_CHECK(value.size() <= static_cast<size_t>(INT32_MAX), "rank ", rank_, ": ", what, " of ", value.size(),
           " bytes is too large to gather");
  const int length = static_cast<int>(value.size());
  std::vector<int> lengths(static_cast<size_t>(size_), 0);
  MPI_Request request;
  check_mpi(MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &request), "MPI_Igather");
  wait_collective(request, rank_, what, timeout_seconds);
  std::vector<int> offsets(static_cast<size_t>(size_), 0);
  int64_t total = lengths[0];
  for (int r = 1; r < size_; ++r) {
    offsets[r] = offsets[r - 1] + lengths[r - 1];
    total += lengths[r];
  }
  DP_CHECK(total <= INT32_MAX, what, ": ", total, " bytes from all ranks is too large to gather");
  std::string all(is_coordinator() ? static_cast<size_t>(total) : 0, '\0');
  check_mpi(MPI_Igatherv(value.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0,
                         MPI_COMM_WORLD, &request),
            "MPI_Igatherv");
  wait_collective(request, rank_, what, timeout_seconds);
  std::vector<std::string> values;
  if (!is_coordinator()) return values;
  for (int r = 0; r < size_; ++r) values.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lengths[r])));
  return values;
}

namespace {

double steady_us() { return trace::now_us_fine(); }  // the clock the trace's spans are on

// A ping-pong's wait: spinning, since sleeping would lengthen the round trip the offset is measured with.
void spin_wait(MPI_Request& request, int rank, double timeout_seconds) {
  const auto started = std::chrono::steady_clock::now();
  for (int done = 0;;) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    DP_CHECK(waited < timeout_seconds, "rank ", rank, ": the clock alignment for --trace did not answer within ",
             timeout_seconds, " s (--transport-timeout): a rank is stuck, dead or unreachable");
    std::this_thread::yield();  // ranks may share cores (--oversubscribe): let the peer run
  }
}

}  // namespace

std::vector<World::ClockOffset> World::clock_offsets_to_coordinator(double timeout_seconds) const {
  if (!uses_mpi_ || size_ == 1) return {ClockOffset{}};
  constexpr int kRounds = 16;
  MPI_Comm comm;
  MPI_Request request;
  check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request), "MPI_Comm_idup");
  wait_collective(request, rank_, "clock alignment", timeout_seconds);
  std::vector<ClockOffset> offsets;
  try {
    if (is_coordinator()) {
      offsets.resize(static_cast<size_t>(size_));
      for (int r = 1; r < size_; ++r) {
        double best_round_trip = -1;
        for (int round = 0; round < kRounds; ++round) {
          double theirs = 0;
          const double sent = steady_us();
          check_mpi(MPI_Isend(&sent, 1, MPI_DOUBLE, r, 0, comm, &request), "MPI_Isend");
          spin_wait(request, rank_, timeout_seconds);
          check_mpi(MPI_Irecv(&theirs, 1, MPI_DOUBLE, r, 0, comm, &request), "MPI_Irecv");
          spin_wait(request, rank_, timeout_seconds);
          const double back = steady_us();
          // Their clock read halfway through the round trip, as well as one can know: the error is at most half
          // the round trip, so the shortest one wins.
          if (best_round_trip < 0 || back - sent < best_round_trip) {
            best_round_trip = back - sent;
            offsets[static_cast<size_t>(r)] = {theirs - (sent + back) / 2, back - sent};
          }
        }
      }
    } else {
      for (int round = 0; round < kRounds; ++round) {
        double ping = 0;
        check_mpi(MPI_Irecv(&ping, 1, MPI_DOUBLE, 0, 0, comm, &request), "MPI_Irecv");
        spin_wait(request, rank_, timeout_seconds);
        const double now = steady_us();
        check_mpi(MPI_Isend(&now, 1, MPI_DOUBLE, 0, 0, comm, &request), "MPI_Isend");
        spin_wait(request, rank_, timeout_seconds);
      }
    }
  } catch (...) {
    MPI_Comm_free(&comm);
    throw;
  }
  MPI_Comm_free(&comm);
  return offsets;
}

void World::run_guarded(const std::function<void()>& work) const {
  if (!uses_mpi_ || size_ == 1) {
    work();
    return;
  }
  try {
    work();
  } catch (const RemoteFailure& e) {
    DP_ERROR(e.what(), "; ending the job");
    abort(failure_exit_code());
  } catch (const std::exception& e) {
    // The job's status says what kind of failure it was (core/exit_codes.h); mpirun passes MPI_Abort's on.
    const int code = dynamic_cast<const UsageError*>(&e) ? kExitUsageError : failure_exit_code();
    // LibTorch's errors carry a C++ backtrace: one line here, the rest at debug level.
    const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
    const std::string reason = torch_error ? torch_error->what_without_backtrace() : e.what();
    if (torch_error) DP_DEBUG("rank ", rank_, ": ", e.what());
    if (is_coordinator()) {
      DP_ERROR("rank 0 failed: ", reason, "; ending the job");
      abort(code);
    }
    DP_ERROR("rank ", rank_, " failed: ", reason);
    report_failure_to_coordinator(rank_, reason);
    // The coordinator ends the job once it reads the report; if it cannot (stuck or gone), end it from here.
    std::this_thread::sleep_for(std::chrono::seconds(5));
    abort(code);
  }
}

std::string World::mpi_version() const {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<size_t>(length));
  const auto newline = version.find_first_of("\r\n,");
  return newline == std::string::npos ? version : version.substr(0, newline);
}

void World::abort(int code) const {
  if (uses_mpi_) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void World::end_process(int code) {
  const char* full = std::getenv("DIFFPIPE_FULL_TEARDOWN");
  if (full != nullptr && std::string(full) == "1") return;
  g_world.reset();  // MPI_Finalize, when MPI runs
  log::finish();     // after it, once mpirun reads again: a stall's dropped-lines notice
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace dp::runtime
