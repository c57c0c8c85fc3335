#include "io/parallel_load.h"

#ifdef DIFFPIPE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <iomanip>
#include <thread>

#include "core/cpu_affinity.h"
#include "core/error.h"
#include "core/human_units.h"
#include "core/log.h"
#include "io/load_budget.h"
#include "io/load_progress.h"
#include "io/torch_tensors.h"

namespace dp::io {
namespace {

// More readers than this stop helping: page-cache copies saturate memory bandwidth, and PCIe saturates sooner.
constexpr int kMaxLoadThreads = 16;
constexpr uint64_t kPageBytes = 4096;

std::mutex history_mutex;
std::vector<LoadFigures> history;
std::mutex policy_mutex;
// prepare_pinned_staging's thread, which the CUDA readers wait for before taking their chunks.
std::mutex staging_mutex;
std::shared_future<void> staging_pinned;
// With DIFFPIPE_PROGRESSIVE_STAGING=1, the chunks pinned one at a time instead, which readers take as they come
// (io/pinned_staging.h). Never deleted: its memory is the driver's to return when the process ends, and
// freeing pinned memory from a static destructor may find the CUDA runtime already unloaded.
StagingChunks* staging_chunks = nullptr;

bool progressive_staging_requested() {
  const char* setting = std::getenv("DIFFPIPE_PROGRESSIVE_STAGING");
  return setting != nullptr && std::strcmp(setting, "1") == 0;
}

StagingChunks* progressive_staging() {
  std::lock_guard<std::mutex> lock(staging_mutex);
  return staging_chunks;
}
LoadPolicy policy;

struct Piece {
  std::size_t tensor = 0;
  uint64_t offset = 0;  // within the tensor's bytes
  uint64_t size = 0;
};

// The work of one load, shared by its readers.
struct LoadJob {
  std::vector<std::string> names;
  std::vector<const TensorInfo*> infos;  // the mapped file's own entries
  std::vector<std::shared_ptr<SafetensorsFile>> files;
  std::vector<at::Tensor> outputs;
  std::vector<Piece> pieces;
  uint64_t piece_bytes = 0;
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  LoadProgress* progress = nullptr;  // told of every piece read

  void piece_read(const Piece& piece) {
    if (progress != nullptr) progress->add(piece.size);
  }

  // Keeps the first failure, with the file and tensor it concerns, and stops the other readers.
  void fail(const Piece& piece, const std::string& what) {
    std::lock_guard<std::mutex> lock(error_mutex);
    failed = true;
    if (error) return;
    error = std::make_exception_ptr(Error(
        str(files[piece.tensor]->path(), ": tensor '", names[piece.tensor], "': loading failed: ", what), __FILE__,
        __LINE__));
  }
};

// Bytes of `info`'s data already in the page cache (mincore over its pages), before anything reads them: a
// load's speed means little without knowing whether it read the disk or memory.
uint64_t resident_bytes(const SafetensorsFile& file, const TensorInfo& info) {
  if (info.nbytes() == 0) return 0;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(file.data(info));
  const uintptr_t aligned = first - first % page;
  const uint64_t span = first + info.nbytes() - aligned;
  std::vector<unsigned char> pages((span + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(aligned), span, pages.data()) != 0) return 0;  // unknown: say not resident
  uint64_t resident = 0;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if ((pages[i] & 1) == 0) continue;
    // Only the part of each page that belongs to the tensor.
    const uint64_t begin = std::max<uint64_t>(aligned + i * page, first);
    const uint64_t end = std::min<uint64_t>(aligned + (i + 1) * page, first + info.nbytes());
    resident += end - begin;
  }
  return resident;
}

// CPU: each piece copied into its tensor's own memory or, for views of the mapping, its pages faulted in (one
// read per page), so that the model's first use finds them resident.
void read_pieces_on_host(LoadJob& job, bool copy) {
  while (!job.failed) {
    const std::size_t i = job.next++;
    if (i >= job.pieces.size()) return;
    const Piece& piece = job.pieces[i];
    const std::byte* source = job.files[piece.tensor]->data(*job.infos[piece.tensor]);
    if (copy) {
      std::memcpy(static_cast<std::byte*>(job.outputs[piece.tensor].data_ptr()) + piece.offset, source + piece.offset,
                  piece.size);
    } else {
      const auto* bytes = reinterpret_cast<const volatile unsigned char*>(source);
      unsigned sum = 0;
      for (uint64_t at = piece.offset; at < piece.offset + piece.size; at += kPageBytes) sum += bytes[at];
      (void)sum;
    }
    job.piece_read(piece);
  }
}

#ifdef DIFFPIPE_HAVE_CUDA
void check_cuda(cudaError_t status, const char* what) {
  DP_CHECK(status == cudaSuccess, what, " failed: ", cudaGetErrorString(status));
}

// One CUDA reader: file -> pinned chunk (pread, the part that scales with threads) -> device on the
// reader's own stream. Two chunks per reader let the next read run while the last copy is in flight.
// `allocated` was recorded on the stream the outputs were allocated on, after the allocation: the caching
// allocator may have handed out memory that work queued on that stream still reads (a VAE loading in the
// background takes blocks the denoising loop has just freed), so no copy starts before that work is done.
// The pinning started by prepare_pinned_staging, if any: a reader that allocated its chunks beside it would
// pin more memory instead of taking the pinned chunks from the cache.
void wait_for_pinned_staging() {
  std::shared_future<void> pinning;
  {
    std::lock_guard<std::mutex> lock(staging_mutex);
    pinning = staging_pinned;
  }
  if (!pinning.valid()) return;
  // Local work that cannot wait on anything remote; bounded anyway, the readers pin their own past it.
  if (pinning.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    DP_WARN("load: pinning the staging chunks took over 30 s; the readers pin their own");
}

void stage_pieces(LoadJob& job, const at::Device& device, cudaEvent_t allocated) {
  c10::cuda::CUDAGuard guard(device.index());
  // Two chunks: from the progressive staging as they are pinned, or else from LibTorch's pinned cache (where
  // prepare_pinned_staging put them, or pinned here).
  StagingChunks* progressive = progressive_staging();
  std::vector<void*> taken;
  if (progressive != nullptr && progressive->chunk_bytes() >= job.piece_bytes) {
    const auto work_taken = [&job] { return job.failed.load() || job.next.load() >= job.pieces.size(); };
    taken = progressive->take(2, work_taken, std::chrono::seconds(30));
    if (taken.empty() && work_taken()) return;  // the readers that had chunks did this load's work
  } else {
    wait_for_pinned_staging();
  }
  // Back when this reader ends, however it ends: after its stream's last copy from them (the loop below
  // synchronizes the stream on every path that issued a copy).
  struct GiveBack {
    StagingChunks* to;
    const std::vector<void*>& chunks;
    ~GiveBack() {
      if (to != nullptr) to->give_back(chunks);
    }
  } give_back{progressive, taken};
  const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);
  at::Tensor cached[2];
  void* chunks[2] = {nullptr, nullptr};
  for (int c = 0; c < 2; ++c) {
    if (taken.size() == 2) {
      chunks[c] = taken[static_cast<std::size_t>(c)];
    } else {
      cached[c] = at::empty({static_cast<int64_t>(job.piece_bytes)}, pinned);
      chunks[c] = cached[c].data_ptr();
    }
  }
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device.index());
  check_cuda(cudaStreamWaitEvent(stream.stream(), allocated, 0), "waiting for the outputs' stream");
  cudaEvent_t copied[2] = {nullptr, nullptr};
  bool in_flight[2] = {false, false};
  std::size_t count = 0;
  const Piece* current = nullptr;
  try {
    for (auto& event : copied) check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    while (!job.failed) {
      const std::size_t i = job.next++;
      if (i >= job.pieces.size()) break;
      current = &job.pieces[i];
      const int slot = static_cast<int>(count++ % 2);
      if (in_flight[slot]) check_cuda(cudaEventSynchronize(copied[slot]), "waiting for a staging copy");
      // pread, not a copy out of the mapping: no page of it gets mapped (SafetensorsFile::read).
      job.files[current->tensor]->read(*job.infos[current->tensor], current->offset, current->size, chunks[slot]);
      auto* target = static_cast<std::byte*>(job.outputs[current->tensor].data_ptr()) + current->offset;
      check_cuda(cudaMemcpyAsync(target, chunks[slot], current->size, cudaMemcpyHostToDevice, stream.stream()),
                 "cudaMemcpyAsync to the device");
      check_cuda(cudaEventRecord(copied[slot], stream.stream()), "cudaEventRecord");
      in_flight[slot] = true;
      job.piece_read(*current);  // read; its copy is queued behind the others on this reader's stream
    }
    check_cuda(cudaStreamSynchronize(stream.stream()), "waiting for the copy stream");
  } catch (const std::exception& e) {
    cudaStreamSynchronize(stream.stream());  // the chunks must outlive their copies, even on failure
    job.fail(current != nullptr ? *current : job.pieces.front(), e.what());
  }
  for (auto& event : copied)
    if (event != nullptr) cudaEventDestroy(event);
}
#endif

void run_readers(LoadJob& job, const at::Device& device, bool host_copies, int threads) {
#ifdef DIFFPIPE_HAVE_CUDA
  // Recorded after the outputs were allocated on this thread's current stream (see stage_pieces).
  cudaEvent_t allocated = nullptr;
  if (device.is_cuda()) {
    check_cuda(cudaEventCreateWithFlags(&allocated, cudaEventDisableTiming), "cudaEventCreate");
    const cudaError_t recorded =
        cudaEventRecord(allocated, c10::cuda::getCurrentCUDAStream(device.index()).stream());
    if (recorded != cudaSuccess) cudaEventDestroy(allocated);
    check_cuda(recorded, "cudaEventRecord on the outputs' stream");
  }
#endif
  const auto reader = [&] {
    try {
      if (device.is_cuda()) {
#ifdef DIFFPIPE_HAVE_CUDA
        stage_pieces(job, device, allocated);
#endif
      } else {
        read_pieces_on_host(job, host_copies);
      }
    } catch (const std::exception& e) {
      job.fail(job.pieces.front(), e.what());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(reader);
  reader();  // the calling thread reads too
  for (auto& thread : pool) thread.join();
#ifdef DIFFPIPE_HAVE_CUDA
  if (allocated != nullptr) cudaEventDestroy(allocated);
#endif
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace

void prepare_pinned_staging(const at::Device& device) {
#ifdef DIFFPIPE_HAVE_CUDA
  if (!device.is_cuda()) return;
  std::lock_guard<std::mutex> lock(staging_mutex);
  if (staging_pinned.valid() || staging_chunks != nullptr) return;
  const int64_t chunk = static_cast<int64_t>(load_policy().piece_bytes);
  const int chunks = 2 * load_threads();
  if (progressive_staging_requested()) {
    const auto index = device.index();
    staging_chunks = new StagingChunks(
        static_cast<std::size_t>(chunk), chunks,
        [index](std::size_t bytes) {
          c10::cuda::CUDAGuard guard(index);
          void* memory = nullptr;
          // Portable: pinned for every context, whichever one a reader's copy runs in.
          check_cuda(cudaHostAlloc(&memory, bytes, cudaHostAllocPortable), "cudaHostAlloc of a staging chunk");
          return memory;
        },
        [](void* memory) { cudaFreeHost(memory); });
    return;
  }
  staging_pinned = std::async(std::launch::async, [device, chunk, chunks] {
    try {
      c10::cuda::CUDAGuard guard(device.index());
      const auto started = std::chrono::steady_clock::now();
      const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);
      std::vector<at::Tensor> held;  // all at once, so that each is a block of its own in the cache
      for (int i = 0; i < chunks; ++i) held.push_back(at::empty({chunk}, pinned));
      held.clear();  // back to the cache, for the readers
      DP_DEBUG("load: pinned ", chunks, " staging chunks of ", human_size(static_cast<double>(chunk)), " in ",
               human_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()),
               " on a thread of their own");
    } catch (const std::exception& e) {
      DP_DEBUG("load: pinning the staging chunks ahead failed, the readers pin their own: ", e.what());
    }
  }).share();
#else
  (void)device;
#endif
}

LoadPolicy load_policy() {
  std::lock_guard<std::mutex> lock(policy_mutex);
  return policy;
}

void set_load_policy(const LoadPolicy& chosen) {
  std::lock_guard<std::mutex> lock(policy_mutex);
  policy = chosen;
}

void check_load_environment() {
  load_threads();
  LoadProgress::interval_from_environment();
}

int load_threads() {
  if (const char* env = std::getenv("DIFFPIPE_LOAD_THREADS")) {
    const int n = std::atoi(env);
    DP_CHECK(n >= 1 && n <= 256, "DIFFPIPE_LOAD_THREADS must be in [1, 256], got '", env, "'");
    return n;
  }
  // The affinity mask, not the machine: a rank bound to one core gains nothing from 16 readers on it.
  return std::clamp(usable_cpus(), 1, kMaxLoadThreads);
}

std::string cpu_binding_warning(int usable, int machine) {
  // Below this many CPUs a load falls far short of the GPU's link; SLURM scripts commonly give 4 or more.
  constexpr int kFewCpus = 4;
  if (usable >= kFewCpus || usable >= machine) return {};
  return str("this rank may run on ", usable, " of the machine's ", machine, " CPUs (its CPU affinity, as the "
             "launcher or a container set it: Open MPI binds each rank to one core when it starts two or fewer), so "
             "its weights load with ",
             usable, " reader thread(s): about 5 GB/s a CPU from the page cache, where 16 read 35 GB/s on an H100 "
             "(bench/RESULTS.md, 2026-12-07). Start the ranks with `mpirun --bind-to none` (launch/mpirun.sh does) "
             "or give each rank more CPUs (`mpirun --map-by slot:PE=8`, SLURM `--cpus-per-task=8`)");
}

at::Tensor LoadedTensors::take(const std::string& name, at::ScalarType dtype) {
  at::Tensor tensor;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return tensor;
    tensor = std::move(it->second);
    tensors_.erase(it);
  }
  // Converted where it lies: on the GPU after the copy, as load_tensor's .to(device, dtype) would round.
  return tensor.scalar_type() == dtype ? tensor : tensor.to(dtype);
}

std::size_t LoadedTensors::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tensors_.size();
}

std::shared_ptr<LoadedTensors> load_parallel(const WeightIndex& weights, const std::vector<std::string>& names,
                                             const at::Device& device, bool host_copies) {
  const auto started = std::chrono::steady_clock::now();
#ifndef DIFFPIPE_HAVE_CUDA
  DP_CHECK(!device.is_cuda(), "loading ", weights.dir(), " onto ", device, ": this build has no CUDA support");
#endif
  LoadJob job;
  job.piece_bytes = std::max<uint64_t>(load_policy().piece_bytes, kPageBytes);
  job.names = names.empty() ? weights.names() : names;
  auto result = std::make_shared<LoadedTensors>();
  LoadFigures& figures = result->figures_;
  figures.source = weights.dir();
  figures.device = device.str();
  uint64_t resident = 0;
  std::size_t piece_count = 0;
  for (std::size_t t = 0; t < job.names.size(); ++t) {
    const std::string& name = job.names[t];
    const TensorInfo& expected = weights.info(name);
    std::shared_ptr<SafetensorsFile> file;
    try {
      file = weights.mapped_file(name);
    } catch (const std::exception& e) {
      DP_FAIL(weights.shard_path(name), ": tensor '", name, "': loading failed: ", e.what());
    }
    // The shard is mapped now, after the index read its header: a file rewritten in between must still hold
    // this tensor where the index said, or the bytes read would belong to something else.
    const TensorInfo* info = file->find(name);
    DP_CHECK(info != nullptr && info->dtype == expected.dtype && info->shape == expected.shape &&
                 info->begin == expected.begin && info->end == expected.end,
             file->path(), ": tensor '", name, "' changed since the folder's headers were read (the file was rewritten)");
    resident += resident_bytes(*file, *info);
    figures.bytes += info->nbytes();
    piece_count += (info->nbytes() + job.piece_bytes - 1) / job.piece_bytes;
    job.infos.push_back(info);
    job.files.push_back(std::move(file));
  }
  figures.tensors = job.names.size();
  figures.resident_fraction = figures.bytes > 0 ? static_cast<double>(resident) / static_cast<double>(figures.bytes) : 1.0;
  figures.threads = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(load_threads()),
                                                           std::max<std::size_t>(piece_count, 1)));
  figures.pinned_staging = device.is_cuda();
  job.outputs.resize(job.names.size());
  LoadProgress progress(figures.source, figures.bytes, LoadProgress::interval_from_environment());
  job.progress = &progress;
  LoadBudget* budget = current_load_budget();
  uint64_t bytes_read = 0;
  // Portions of the tensors, in order: all at once without a budget; with one, what fits in its room now, then
  // (after waiting for the lift) the rest. Memory is allocated a portion at a time, just before it is read.
  for (std::size_t begin = 0; begin < job.names.size();) {
    const uint64_t room = budget != nullptr ? budget->room() : LoadBudget::kUnlimited;
    std::size_t end = begin;
    uint64_t portion_bytes = 0;
    while (end < job.names.size() && job.infos[end]->nbytes() <= room - portion_bytes)
      portion_bytes += job.infos[end++]->nbytes();
    if (end == begin) {
      figures.bytes_before_wait = bytes_read;
      const double waited = budget->wait_for_lift();
      figures.waited_seconds += waited;
      progress.waited(waited);
      continue;
    }
    if (budget != nullptr) budget->take(portion_bytes);
    job.pieces.clear();
    job.next = 0;
    for (std::size_t t = begin; t < end; ++t) {
      const TensorInfo& info = *job.infos[t];
      const auto options = at::TensorOptions().dtype(to_scalar_type(info.dtype)).device(device);
      if (device.is_cuda() || host_copies) {
        job.outputs[t] = at::empty(info.shape, options);
      } else {
        job.outputs[t] = tensor_view(job.files[t], info);
      }
      for (uint64_t offset = 0; offset < info.nbytes(); offset += job.piece_bytes)
        job.pieces.push_back({t, offset, std::min(job.piece_bytes, info.nbytes() - offset)});
    }
    if (!job.pieces.empty()) run_readers(job, device, host_copies, figures.threads);
    bytes_read += portion_bytes;
    begin = end;
  }
  for (std::size_t t = 0; t < job.names.size(); ++t) result->tensors_[job.names[t]] = std::move(job.outputs[t]);
  figures.progress_lines = progress.lines();
  figures.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() - figures.waited_seconds;
  DP_INFO("load ", figures.source, ": ", figures.tensors, " tensors, ", std::fixed, std::setprecision(3),
          figures.bytes / 1e9, " GB in ", figures.seconds, " s (", std::setprecision(2), figures.gigabytes_per_second(),
          " GB/s) to ", figures.device, " with ", figures.threads, " reader(s)",
          figures.pinned_staging ? ", pinned chunks on one copy stream each"
                                 : (host_copies ? ", copied on the host" : ", pages faulted in"),
          "; ",
          std::setprecision(0), figures.resident_fraction * 100, "% was in the page cache before",
          figures.waited_seconds > 0 ? str("; ", human_size(static_cast<double>(figures.bytes_before_wait)),
                                           " before waiting ", human_seconds(figures.waited_seconds), " for ",
                                           budget->awaited())
                                     : std::string());
  {
    std::lock_guard<std::mutex> lock(history_mutex);
    history.push_back(figures);
  }
  return result;
}

std::optional<StagingChunks::Progress> progressive_staging_progress() {
  const StagingChunks* chunks = progressive_staging();
  if (chunks == nullptr) return std::nullopt;
  return chunks->progress();
}

std::vector<LoadFigures> load_history() {
  std::lock_guard<std::mutex> lock(history_mutex);
  return history;
}

nlohmann::ordered_json load_figures_json(const std::vector<LoadFigures>& loads) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& f : loads)
    out.push_back({{"source", f.source},
                   {"device", f.device},
                   {"tensors", f.tensors},
                   {"bytes", f.bytes},
                   {"seconds", f.seconds},
                   {"gb_per_s", f.gigabytes_per_second()},
                   {"page_cache_resident_fraction", f.resident_fraction},
                   {"readers", f.threads},
                   {"pinned_staging", f.pinned_staging},
                   {"waited_seconds", f.waited_seconds},
                   {"bytes_before_wait", f.bytes_before_wait}});
  return out;
}

}  // namespace dp::io
