// The parallel loader (io/parallel_load.h) against the one-by-one load_tensor: the same bits for every tensor of
// the tiny pipeline and of a model split into many shards, read by many threads; a shard damaged after the
// folder was opened fails naming the file and the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "bind_one_cpu.h"
#include "core/cpu_affinity.h"
#include "core/error.h"
#include "fixtures/random_model.h"
#include "fixtures/tiny_pipeline.h"
#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "io/load_budget.h"
#include "io/load_progress.h"
#include "io/parallel_load.h"
#include "io/torch_tensors.h"
#include "models/flux/flux_transformer.h"
#include "models/module_weights.h"
#include "pipeline/device_stats.h"
#include "test_support.h"

namespace dp {
namespace {

namespace fs = std::filesystem;

// For one test: more readers than this machine's cores, and pieces of one page, so that the fixtures' small
// tensors are split between readers as a full-size model's are.
class LoadThreads {
 public:
  explicit LoadThreads(int n) {
    ::setenv("DIFFPIPE_LOAD_THREADS", std::to_string(n).c_str(), 1);
    io::LoadPolicy policy;
    policy.piece_bytes = 4096;
    io::set_load_policy(policy);
  }
  ~LoadThreads() {
    ::unsetenv("DIFFPIPE_LOAD_THREADS");
    io::set_load_policy({});
  }
};

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Every tensor of `dir`, taken from a parallel load at `dtype`, equals load_tensor's at that dtype.
void expect_same_as_sequential(const std::string& dir, at::ScalarType dtype, bool host_copies) {
  const auto index = io::WeightIndex::open_dir(dir);
  const auto loaded = io::load_parallel(index, {}, at::kCPU, host_copies);
  EXPECT_EQ(loaded->size(), index.size()) << dir;
  EXPECT_EQ(loaded->figures().bytes, index.total_bytes()) << dir;
  for (const auto& name : index.names()) {
    const at::Tensor parallel = loaded->take(name, dtype);
    ASSERT_TRUE(parallel.defined()) << dir << ": " << name;
    EXPECT_TRUE(same_bits(parallel, io::load_tensor(index, name, dtype))) << dir << ": " << name;
  }
  EXPECT_EQ(loaded->size(), 0u) << "every tensor is handed out once";
  EXPECT_FALSE(loaded->take(index.names().front(), dtype).defined());
}

TEST(ParallelLoad, TinyPipelineGivesTheSequentialBits) {
  const LoadThreads threads(7);
  const std::string root = test::temp_dir("parallel-load-tiny");
  fixtures::write_tiny_pipeline(root, {});
  for (const char* component : {"text_encoder", "text_encoder_2", "transformer", "vae"}) {
    for (bool host_copies : {false, true}) {
      SCOPED_TRACE(std::string(component) + (host_copies ? " (host copies)" : " (views)"));
      expect_same_as_sequential(root + "/" + component, at::kFloat, host_copies);
      expect_same_as_sequential(root + "/" + component, at::kBFloat16, host_copies);
    }
  }
}

// The tiny transformer written in many small shards.
std::string write_sharded_transformer(const std::string& tag) {
  const models::FluxConfig config = fixtures::tiny_flux_config();
  const std::string root = test::temp_dir(tag);
  fixtures::RandomWriteOptions options;
  options.dtype = io::DType::F32;
  options.seed = 11;
  options.max_shard_bytes = 40'000;
  fixtures::write_random_component(root, fixtures::flux_transformer_component(config), options);
  return root + "/transformer";
}

TEST(ParallelLoad, ShardedModelGivesTheSequentialBits) {
  const LoadThreads threads(5);
  const std::string dir = write_sharded_transformer("parallel-load-shards");
  std::set<std::string> shards;
  const auto index = io::WeightIndex::open_dir(dir);
  for (const auto& name : index.names()) shards.insert(index.shard_path(name));
  ASSERT_GE(shards.size(), 3u) << "the fixture must have several shards";
  for (bool host_copies : {false, true}) {
    SCOPED_TRACE(host_copies ? "host copies" : "views");
    expect_same_as_sequential(dir, at::kFloat, host_copies);
    expect_same_as_sequential(dir, at::kHalf, host_copies);
  }
  EXPECT_GE(io::load_history().size(), 4u);
  EXPECT_DOUBLE_EQ(io::load_history().back().resident_fraction, 1.0) << "just written and read: in the page cache";
}

// One environment variable set for one test, unset again after it.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedVariable() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST(LoadProgress, ALineWhenOneIsDueWithTheBytesTheRateAndTheTimeLeft) {
  std::vector<std::string> lines;
  io::LoadProgress due("/models/flux/transformer", 3'000'000'000, 1e-9,
                       [&](const std::string& line) { lines.push_back(line); });
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  due.add(1'000'000'000);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(due.lines(), 1);
  EXPECT_NE(lines[0].find("load /models/flux/transformer: 1.00 of 3.00 GB read (33%) in "), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find(" GB/s, about "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(" left"), std::string::npos) << lines[0];

  std::vector<std::string> none;
  io::LoadProgress never("/m", 3'000'000'000, 0, [&](const std::string& l) { none.push_back(l); });
  io::LoadProgress not_yet("/m", 3'000'000'000, 3600, [&](const std::string& l) { none.push_back(l); });
  for (int i = 0; i < 3; ++i) {
    never.add(1'000'000'000);
    not_yet.add(1'000'000'000);
  }
  EXPECT_TRUE(none.empty()) << "0 writes no line, and a load faster than the interval none";
  EXPECT_EQ(never.bytes_done(), 3'000'000'000u);
}

// Readers on many threads: every byte counted, and each due line written once, by one of them.
TEST(LoadProgress, ReadersOnManyThreadsCountEveryByte) {
  std::atomic<int> written{0};
  io::LoadProgress progress("/m", 8 * 5000 * 4096, 1e-5, [&](const std::string&) { ++written; });
  std::vector<std::thread> readers;
  for (int t = 0; t < 8; ++t)
    readers.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) progress.add(4096);
    });
  for (auto& reader : readers) reader.join();
  EXPECT_EQ(progress.bytes_done(), uint64_t{8} * 5000 * 4096);
  EXPECT_EQ(written.load(), progress.lines());
  EXPECT_LE(progress.lines(), 8 * 5000);
}

TEST(LoadProgress, TheIntervalComesFromTheEnvironmentAndIsChecked) {
  ::unsetenv("DIFFPIPE_LOAD_PROGRESS_SECONDS");
  EXPECT_DOUBLE_EQ(io::LoadProgress::interval_from_environment(), 5.0);
  {
    const ScopedVariable zero("DIFFPIPE_LOAD_PROGRESS_SECONDS", "0");
    EXPECT_DOUBLE_EQ(io::LoadProgress::interval_from_environment(), 0.0);
  }
  {
    const ScopedVariable half("DIFFPIPE_LOAD_PROGRESS_SECONDS", "0.5");
    EXPECT_DOUBLE_EQ(io::LoadProgress::interval_from_environment(), 0.5);
  }
  for (const char* bad : {"", "five", "-1", "2s", "inf", "nan"}) {
    const ScopedVariable variable("DIFFPIPE_LOAD_PROGRESS_SECONDS", bad);
    try {
      io::check_load_environment();
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("DIFFPIPE_LOAD_PROGRESS_SECONDS"), std::string::npos) << message;
      EXPECT_NE(message.find(std::string("got '") + bad + "'"), std::string::npos) << message;
    }
  }
}

// A load that outlasts the interval says how far it got while it reads; a fast one only its last line.
TEST(ParallelLoad, ALongLoadWritesProgressLines) {
  const LoadThreads threads(3);
  const std::string dir = write_sharded_transformer("parallel-load-progress");
  {
    const ScopedVariable often("DIFFPIPE_LOAD_PROGRESS_SECONDS", "0.000001");
    expect_same_as_sequential(dir, at::kFloat, true);
    EXPECT_GE(io::load_history().back().progress_lines, 1);
  }
  expect_same_as_sequential(dir, at::kFloat, true);
  EXPECT_EQ(io::load_history().back().progress_lines, 0) << "a load of milliseconds, against 5 s";
}

// A rank bound to one core (Open MPI's default for two ranks) loads with one reader, not 16 crowding the core,
// and gets the same bits; a thread it starts (the readers) inherits the mask.
TEST(ParallelLoad, AThreadBoundToOneCpuLoadsWithOneReader) {
  ASSERT_EQ(std::getenv("DIFFPIPE_LOAD_THREADS"), nullptr) << "the test's environment sets the reader count";
  io::LoadPolicy policy;
  policy.piece_bytes = 4096;
  io::set_load_policy(policy);
  const std::string dir = write_sharded_transformer("parallel-load-bound");
  std::thread bound([&] {
    ASSERT_GE(test::bind_this_thread_to_one_cpu(), 0);
    EXPECT_EQ(io::load_threads(), 1);
    expect_same_as_sequential(dir, at::kFloat, true);
    EXPECT_EQ(io::load_history().back().threads, 1);
  });
  bound.join();
  io::set_load_policy({});
  EXPECT_EQ(io::load_threads(), std::min(usable_cpus(), 16)) << "this thread's mask is its own";
}

// The warning a GPU rank gets when its launcher bound it to a core or two: the cause and the fix, and nothing
// where the rank has enough CPUs or the machine has no more.
TEST(ParallelLoad, CpuBindingWarningNamesTheCauseAndTheFix) {
  const std::string warning = io::cpu_binding_warning(1, 16);
  for (const std::string part : {"1 of the machine's 16 CPUs", "Open MPI binds each rank to one core",
                                 "1 reader thread(s)", "mpirun --bind-to none", "--cpus-per-task"})
    EXPECT_NE(warning.find(part), std::string::npos) << part << " in: " << warning;
  EXPECT_FALSE(io::cpu_binding_warning(3, 128).empty());
  EXPECT_TRUE(io::cpu_binding_warning(4, 128).empty()) << "4 CPUs, a common --cpus-per-task";
  EXPECT_TRUE(io::cpu_binding_warning(16, 16).empty());
  EXPECT_TRUE(io::cpu_binding_warning(2, 2).empty()) << "the machine has no more to give";
  EXPECT_TRUE(io::cpu_binding_warning(1, 1).empty());
}

// A model's read-ahead scope gives every tensor as reading one by one does, part of a model too.
TEST(ParallelLoad, ReadAheadScopeGivesTheSequentialBits) {
  const LoadThreads threads(3);
  const std::string dir = write_sharded_transformer("parallel-load-scope");
  auto index = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(dir));
  const models::ModuleWeights one_by_one(index, at::kBFloat16, at::kCPU);
  const models::ModuleWeights ahead = one_by_one.child("single_transformer_blocks").read_ahead(
      [](const std::string& name) { return name.find(".1.") != std::string::npos; });
  const auto before = io::load_history().size();
  for (const std::string name : {"1.proj_out.weight", "1.norm.linear.bias", "0.proj_mlp.weight"}) {
    EXPECT_TRUE(same_bits(ahead.get(name), one_by_one.child("single_transformer_blocks").get(name))) << name;
    EXPECT_TRUE(same_bits(ahead.get(name, at::kFloat), one_by_one.child("single_transformer_blocks").get(name, at::kFloat)))
        << name << " asked twice, the second time at another dtype";
  }
  EXPECT_EQ(io::load_history().size(), before) << "the read-ahead happened once, in read_ahead()";

  io::LoadPolicy off_policy;
  off_policy.read_ahead = false;
  io::set_load_policy(off_policy);
  const models::ModuleWeights off = one_by_one.read_ahead();
  io::set_load_policy({});
  EXPECT_EQ(io::load_history().size(), before) << "the policy turned read-ahead off";
  EXPECT_TRUE(same_bits(off.get("proj_out.weight"), one_by_one.get("proj_out.weight")));
}

TEST(ParallelLoad, DamagedShardFailsNamingFileAndTensor) {
  const std::string dir = write_sharded_transformer("parallel-load-damaged");
  const auto index = io::WeightIndex::open_dir(dir);
  const std::string victim = index.names().back();
  const std::string shard = index.shard_path(victim);
  // Cut after the folder's headers were read: the shard no longer holds the data its header promises.
  fs::resize_file(shard, fs::file_size(shard) - 16);
  try {
    io::load_parallel(index, {}, at::kCPU);
    FAIL() << "a truncated shard loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(shard), std::string::npos) << message;
    EXPECT_NE(message.find("tensor '"), std::string::npos) << message;
    EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  }
}

TEST(ParallelLoad, RewrittenShardFailsNamingFileAndTensor) {
  const std::string dir = write_sharded_transformer("parallel-load-rewritten");
  const auto index = io::WeightIndex::open_dir(dir);
  // Another shard's bytes in place of this one: a valid file, but not the tensors the index read.
  std::set<std::string> shards;
  for (const auto& name : index.names()) shards.insert(index.shard_path(name));
  const std::string first = *shards.begin(), second = *std::next(shards.begin());
  fs::copy_file(second, first, fs::copy_options::overwrite_existing);
  try {
    io::load_parallel(index, {}, at::kCPU);
    FAIL() << "a rewritten shard loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(first), std::string::npos) << message;
    EXPECT_NE(message.find("tensor '"), std::string::npos) << message;
  }
}

// A load under a budget a third the component's size, lifted by another thread `hold` after the load began
// to wait for it (so the wait lasts at least `hold` however slow the load's start: a fresh CUDA context and
// pinned buffers took 250 ms on an H100): what the load has taken from the device by then (peak allocated on
// CUDA, 0 on the CPU) is noted just before the lift.
struct BudgetedLoad {
  std::shared_ptr<io::LoadedTensors> loaded;
  uint64_t early_bytes = 0;
  uint64_t taken_early = 0;
  uint64_t device_bytes_before_lift = 0;
};

BudgetedLoad load_under_budget(const io::WeightIndex& index, const at::Device& device, bool host_copies,
                               std::chrono::milliseconds hold) {
  BudgetedLoad out;
  out.early_bytes = index.total_bytes() / 3;
  io::LoadBudget budget(out.early_bytes, "the test's lift", std::chrono::milliseconds(30000));
  pipeline::reset_peak_memory(device);
  std::thread lifter([&] {
    // Bounded: a load that never waits fails the test's figures after 30 s rather than hang it.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (budget.waiters() == 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(hold);
    if (device.is_cuda()) out.device_bytes_before_lift = pipeline::peak_memory_bytes(device);
    budget.lift();
  });
  try {
    const io::ScopedLoadBudget scoped(&budget);
    out.loaded = io::load_parallel(index, {}, device, host_copies);
  } catch (...) {
    lifter.join();
    throw;
  }
  lifter.join();
  out.taken_early = budget.taken_early();
  return out;
}

// With a budget installed, the tensors that fit load at once, the rest after the lift; the bits are the same.
TEST(ParallelLoad, ABudgetLoadsWhatFitsThenTheRestAfterItsLift) {
  const LoadThreads threads(4);
  const std::string dir = write_sharded_transformer("parallel-load-budget");
  const auto index = io::WeightIndex::open_dir(dir);
  for (bool host_copies : {false, true}) {
    SCOPED_TRACE(host_copies ? "host copies" : "views");
    const BudgetedLoad load = load_under_budget(index, at::kCPU, host_copies, std::chrono::milliseconds(300));
    const io::LoadFigures& figures = load.loaded->figures();
    EXPECT_EQ(figures.bytes, index.total_bytes());
    EXPECT_GT(figures.bytes_before_wait, 0u) << "what fitted was read before the wait";
    EXPECT_LE(figures.bytes_before_wait, load.early_bytes);
    EXPECT_EQ(figures.bytes_before_wait, load.taken_early);
    EXPECT_GE(figures.waited_seconds, 0.2) << "the rest waited for the lift";
    EXPECT_LT(figures.seconds, figures.waited_seconds + 30) << "reading time does not count the wait";
    for (const auto& name : index.names())
      EXPECT_TRUE(same_bits(load.loaded->take(name, at::kFloat), io::load_tensor(index, name, at::kFloat))) << name;
  }
  const auto json = io::load_figures_json({io::load_history().back()});
  EXPECT_GE(json[0]["waited_seconds"].get<double>(), 0.2) << json.dump();
}

// On the GPU the budget bounds device memory: before the lift, the load has allocated no more than it allows.
TEST(ParallelLoad, CudaBudgetBoundsDeviceMemoryUntilTheLift) {
  DP_TEST_NEED_CUDA();
  const LoadThreads threads(4);
  const std::string dir = write_sharded_transformer("parallel-load-budget-cuda");
  const auto index = io::WeightIndex::open_dir(dir);
  const at::Device cuda(at::kCUDA, 0);
  const BudgetedLoad load = load_under_budget(index, cuda, false, std::chrono::milliseconds(500));
  EXPECT_GT(load.device_bytes_before_lift, 0u);
  // The caching allocator rounds each tensor up to 512 bytes; the budget counts the files' bytes.
  EXPECT_LE(load.device_bytes_before_lift, load.early_bytes + 512 * index.size());
  EXPECT_GE(load.loaded->figures().waited_seconds, 0.3);
  for (const auto& name : index.names())
    EXPECT_TRUE(same_bits(load.loaded->take(name, at::kFloat).cpu(), io::load_tensor(index, name, at::kFloat))) << name;
}

// Memory just freed on a stream may still be read by kernels queued there; the caching allocator hands it out
// again at once to an allocation on the same stream. A load on that stream (the VAE loading in the background
// while the loop denoises) must not copy into it before those kernels ran: a kernel queued behind a 1 s spin
// reads a tensor that is freed, and the load takes its memory, before the spin ends.
TEST(ParallelLoad, CudaCopiesWaitForWorkQueuedOnTheOutputsStream) {
  DP_TEST_NEED_CUDA();
#ifdef DIFFPIPE_HAVE_CUDA
  const LoadThreads threads(4);
  const std::string dir = write_sharded_transformer("parallel-load-cuda-reuse");
  const auto index = io::WeightIndex::open_dir(dir);
  const at::Device cuda(at::kCUDA, 0);
  pipeline::synchronize(cuda);
  c10::cuda::CUDACachingAllocator::emptyCache();  // the busy tensor's segment is then the small pool's only one
  at::Tensor busy = at::full({128 * 1024}, 3.0, at::TensorOptions().device(cuda));  // 512 kB: the small pool
  const auto busy_begin = reinterpret_cast<uintptr_t>(busy.data_ptr());
  const auto busy_end = busy_begin + busy.nbytes();
  pipeline::synchronize(cuda);
  at::cuda::sleep(int64_t{2'000'000'000});  // about 1 s at the H200's clock
  const at::Tensor doubled = busy * 2;        // reads busy after the spin
  busy.reset();
  const auto loaded = io::load_parallel(index, {}, cuda);
  bool reused = false;
  std::vector<std::pair<std::string, at::Tensor>> taken;
  for (const auto& name : index.names()) {
    at::Tensor t = loaded->take(name, at::kFloat);
    const auto address = reinterpret_cast<uintptr_t>(t.data_ptr());
    reused = reused || (address >= busy_begin && address < busy_end);
    taken.emplace_back(name, std::move(t));
  }
  pipeline::synchronize(cuda);
  EXPECT_TRUE(reused) << "the load did not take the freed tensor's memory: this test shows nothing";
  EXPECT_TRUE(at::equal(doubled.cpu(), at::full({128 * 1024}, 6.0))) << "a copy overwrote memory a queued kernel read";
  for (const auto& [name, t] : taken) EXPECT_TRUE(same_bits(t.cpu(), io::load_tensor(index, name, at::kFloat))) << name;
#endif
}

// The GPU path: pinned chunks, copy streams, conversion on the device, against load_tensor's .to(cuda, dtype).
TEST(ParallelLoad, CudaStagingGivesTheSequentialBits) {
  DP_TEST_NEED_CUDA();
  const LoadThreads threads(6);
  const std::string dir = write_sharded_transformer("parallel-load-cuda");
  const auto index = io::WeightIndex::open_dir(dir);
  const at::Device cuda(at::kCUDA, 0);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const auto loaded = io::load_parallel(index, {}, cuda);
    EXPECT_TRUE(loaded->figures().pinned_staging);
    for (const auto& name : index.names()) {
      const at::Tensor parallel = loaded->take(name, dtype);
      ASSERT_TRUE(parallel.defined() && parallel.is_cuda()) << name;
      EXPECT_TRUE(same_bits(parallel.cpu(), io::load_tensor(index, name, dtype, cuda).cpu())) << name << " " << dtype;
    }
  }
}

// DIFFPIPE_PROGRESSIVE_STAGING=1: the chunks pinned one at a time and taken as they come give the same bits.
TEST(ParallelLoad, CudaProgressiveStagingGivesTheSequentialBits) {
  DP_TEST_NEED_CUDA();
  const LoadThreads threads(6);
  ASSERT_EQ(::setenv("DIFFPIPE_PROGRESSIVE_STAGING", "1", 1), 0);
  const at::Device cuda(at::kCUDA, 0);
  io::prepare_pinned_staging(cuda);
  const auto progress = io::progressive_staging_progress();
  // No other test prepares the staging: this one's call is the process's first, so the chunks are progressive.
  ASSERT_TRUE(progress.has_value()) << "the staging was prepared before this test, without the progressive chunks";
  const std::string dir = write_sharded_transformer("parallel-load-cuda-progressive");
  const auto index = io::WeightIndex::open_dir(dir);
  const auto loaded = io::load_parallel(index, {}, cuda);  // starts while the chunks are still being pinned
  for (const auto& name : index.names()) {
    const at::Tensor parallel = loaded->take(name, at::kBFloat16);
    ASSERT_TRUE(parallel.defined() && parallel.is_cuda()) << name;
    EXPECT_TRUE(same_bits(parallel.cpu(), io::load_tensor(index, name, at::kBFloat16, cuda).cpu())) << name;
  }
  for (int i = 0; i < 30000 && !io::progressive_staging_progress()->finished; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto done = *io::progressive_staging_progress();
  EXPECT_TRUE(done.finished);
  EXPECT_EQ(done.pinned, 12) << done.error;  // two for each of the 6 readers
  EXPECT_TRUE(done.error.empty()) << done.error;
}

}  // namespace
}  // namespace dp
