#pragma once
// Reading a component's tensors onto a device at the hardware's rate: a bounded pool of reader threads over the
// shards' tensors. On CUDA each reader copies from the file's mapping straight into one of its two reusable
// pinned chunks and sends the chunk on its own copy stream, so host reads, PCIe copies and the next read
// overlap; tensors arrive in the file's dtype and are converted on the device when taken. On the CPU the
// readers fault the mapped pages in, in parallel, and the tensors stay views of the mapping, as load_tensor
// gives them. Either way a tensor taken from here has the bits load_tensor would give.
#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/pinned_staging.h"
#include "io/weight_index.h"

namespace dp::io {

// What one parallel load did, for the log and the run's report.
struct LoadFigures {
  std::string source;  // the component folder
  std::string device;
  uint64_t tensors = 0;
  uint64_t bytes = 0;  // as stored in the files
  double seconds = 0;  // reading, not counting waits for a load budget (io/load_budget.h)
  double resident_fraction = 0;  // of `bytes`, in the page cache before the load started (mincore)
  int threads = 0;
  bool pinned_staging = false;  // CUDA: through pinned chunks on copy streams
  // With a load budget on the loading thread: the time spent waiting for its lift, and the bytes read before.
  double waited_seconds = 0;
  uint64_t bytes_before_wait = 0;
  int progress_lines = 0;  // lines written while it read (io/load_progress.h: every 5 s by default)
  double gigabytes_per_second() const { return seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0.0; }
};

// How components load, chosen once per process by whoever knows the memory plan (the generate command).
struct LoadPolicy {
  bool read_ahead = true;       // false: every tensor read one by one, the order before parallel loading
  bool bounded_memory = false;  // a device memory cap: tensors stored wider than the run dtype read one by one
  // A reader's unit of work and the size of each of its two pinned chunks: large enough that a copy's launch
  // cost is noise, small enough that 16 readers pin 256 MB in all. Tests make it small to split small tensors.
  uint64_t piece_bytes = uint64_t{8} << 20;
  // A component converted as it loads (the FLUX blocks under --fp8-gemms) is read ahead this many bytes at a
  // time, each part converted before the next is read: the device then holds one part in the file's dtype beside
  // what is already converted, not the whole component twice. Tests make it small to split a tiny model.
  uint64_t converting_part_bytes = uint64_t{2} << 30;
};
LoadPolicy load_policy();
void set_load_policy(const LoadPolicy& policy);

// Readers used by a parallel load: min(the CPUs this thread may run on, 16), overridden by DIFFPIPE_LOAD_THREADS
// (1 gives the sequential order, for comparisons).
int load_threads();
// What to tell a user whose rank may run on few of the machine's CPUs (`usable` of `machine`), where loads would
// crawl; empty when there are enough. The message names the cause and the launcher options that fix it.
std::string cpu_binding_warning(int usable, int machine);
// Reads the loader's settings from the environment (DIFFPIPE_LOAD_THREADS, DIFFPIPE_LOAD_PROGRESS_SECONDS) and
// throws on a bad one: called before any work, so that a typo is refused at the start, not after the encoders ran.
void check_load_environment();

// Tensors read ahead of the model code that asks for them, in the file's dtype on the target device. Each is
// handed out once (take), so the component's memory is held once.
class LoadedTensors {
 public:
  // The tensor `name` converted to `dtype` (on its device), removed from the set; undefined when absent.
  at::Tensor take(const std::string& name, at::ScalarType dtype);
  std::size_t size() const;
  const LoadFigures& figures() const { return figures_; }

 private:
  friend std::shared_ptr<LoadedTensors> load_parallel(const WeightIndex&, const std::vector<std::string>&,
                                                      const at::Device&, bool);
  mutable std::mutex mutex_;
  std::map<std::string, at::Tensor> tensors_;
  LoadFigures figures_;
};

// Reads `names` (all of `weights` when empty) onto `device` with load_threads() readers. With a load budget
// installed on the calling thread (io/load_budget.h), tensors are allocated and read in file order as far as its
// room allows, and the rest after it is lifted. A tensor that cannot
// be read fails the whole load with an error naming its file and the tensor. Logs the figures and adds them to
// load_history(). On the CPU, `host_copies` gives tensors in memory of their own, copied in parallel, instead of
// views of the mapping (for weights that must stay when the file goes, and to test the pieces' arithmetic
// without a GPU).
std::shared_ptr<LoadedTensors> load_parallel(const WeightIndex& weights, const std::vector<std::string>& names,
                                             const at::Device& device, bool host_copies = false);

// Pins the CUDA readers' staging chunks (two of LoadPolicy::piece_bytes per reader) on a thread of their own,
// into LibTorch's pinned-memory cache, where the readers find them: pinning costs about 0.8 ms a megabyte (213 ms
// for 256 MB on an H100, bench/first_use.py), which the first load paid before its first read. Called once the
// device is known, before the loads; readers that start earlier wait for it. A no-op off CUDA or when called again.
void prepare_pinned_staging(const at::Device& device);

// With DIFFPIPE_PROGRESSIVE_STAGING=1 (opt-in), prepare_pinned_staging pins the chunks
// one at a time and readers take them as they come (io/pinned_staging.h): how far that pinning got, or nothing
// when this process stages otherwise.
std::optional<StagingChunks::Progress> progressive_staging_progress();

// Every parallel load of this process so far, in order (a run's report lists them).
std::vector<LoadFigures> load_history();
// As the reports write them: one object per load.
nlohmann::ordered_json load_figures_json(const std::vector<LoadFigures>& loads);

}  // namespace dp::io
