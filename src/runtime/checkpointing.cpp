#include "runtime/checkpointing.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint_dir.h"
#include "io/embeddings_cache_file.h"
#include "io/torch_tensors.h"
#include "runtime/distributed_generate.h"

namespace dp::runtime {
namespace {

namespace fs = std::filesystem;

at::ScalarType scalar_type_of(const std::string& dtype) { return io::parse_run_scalar_type(dtype, "checkpoint dtype"); }

}  // namespace

io::RawTensor to_raw(const at::Tensor& tensor) {
  auto copy = std::make_shared<at::Tensor>(tensor.to(at::kCPU).contiguous());
  if (copy->data_ptr() == tensor.data_ptr()) *copy = copy->clone();  // own the bytes: the loop moves on
  io::RawTensor raw;
  raw.dtype = io::run_dtype_name(copy->scalar_type());
  raw.shape = copy->sizes().vec();
  raw.data = static_cast<const uint8_t*>(copy->data_ptr());
  raw.nbytes = copy->nbytes();
  raw.owner = copy;
  return raw;
}

at::Tensor from_raw(const io::RawTensor& raw, const at::Device& device) {
  const at::Tensor view = at::from_blob(const_cast<uint8_t*>(raw.data), raw.shape, at::TensorOptions().dtype(scalar_type_of(raw.dtype)));
  return view.clone().to(device);  // owns its bytes: the record may go away
}

Checkpointer::Checkpointer(const CheckpointOptions& options, io::Checkpoint base)
    : options_(options), base_(std::move(base)) {
  base_.run_id = options.run_id;
  if (const char* hold = std::getenv("DIFFPIPE_TEST_HOLD_AT_STEP")) hold_at_step_ = std::atoi(hold);
}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();  // never leave a writer running; its failure was or will be lost
}

void Checkpointer::finish() {
  if (writer_.joinable()) writer_.join();
  if (write_failure_) {
    auto failure = write_failure_;
    write_failure_ = nullptr;
    std::rethrow_exception(failure);
  }
}

bool Checkpointer::at_boundary(const pipeline::LoopState& state) {
  if (options_.dir.empty()) return false;
  if (options_.every > 0 && state.steps_done > 0 && state.steps_done > last_written_step_ &&
      state.steps_done % options_.every == 0 && state.steps_done < state.steps)
    write(state);
  if (state.steps_done == hold_at_step_ && !held_) {
    // Tests stop a run at an exact step with a real signal: the run waits here (bounded) for it.
    held_ = true;
    finish();  // what was written up to here is on disk while the test acts
    DP_INFO("test hook: holding at step ", state.steps_done, " for a stop signal (at most 60 s)");
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!stop_requested() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const StopRequest request = stop_requested();
  if (!request) return false;
  write(state);
  finish();  // the checkpoint is on disk before every rank is told to stop
  DP_WARN("stop requested by ", request.describe(), ": checkpoint ", last_path_, " written at step ",
          state.steps_done, "/", state.steps, "; stopping every rank (exit ", kExitCheckpointedAndStopped, ")");
  stopped_ = true;
  return true;
}

void Checkpointer::write(const pipeline::LoopState& state) {
  finish();  // one write at a time, in order
  const auto started = std::chrono::steady_clock::now();
  auto c = std::make_shared<io::Checkpoint>(base_);  // shares the embeddings' bytes
  c->image_steps = state.image_steps;
  c->latents = to_raw(state.latents());  // a host copy: the loop moves on
  const double copy_ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() * 1000;
  const std::string path = (fs::path(options_.dir) / io::checkpoint_file_name(state.steps_done, base_.run_id)).string();
  last_path_ = path;
  last_written_step_ = state.steps_done;
  ++written_;
  const std::string dir = options_.dir;
  const int keep = options_.keep, step = state.steps_done, steps = state.steps;
  writer_ = std::thread([this, c, path, dir, keep, step, steps, copy_ms] {
    try {
      const auto began = std::chrono::steady_clock::now();
      io::write_checkpoint(path, *c);
      io::prune_run_checkpoints(dir, c->run_id, keep);  // this run's files only; each removal logged
      DP_INFO("checkpoint ", path, " written (step ", step, "/", steps, "): ", std::fixed, std::setprecision(1),
              copy_ms, " ms in the loop (host copy), ",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() * 1000,
              " ms writing in the background");
    } catch (...) {
      write_failure_ = std::current_exception();
    }
  });
}

std::string encoder_fingerprint(const io::ModelFolder& folder) {
  return model_fingerprint(folder.component("text_encoder").path) + "-" +
         model_fingerprint(folder.component("text_encoder_2").path);
}

pipeline::PromptEmbeddings encode_prompts_cached(pipeline::FluxPipeline& flux, const pipeline::GenerateRequest& request,
                                                 const std::string& cache_path) {
  if (cache_path.empty()) return flux.encode_prompts(request);
  const std::string fingerprint = encoder_fingerprint(flux.folder());
  const std::string dtype = io::run_dtype_name(request.dtype);
  auto entries = io::read_embeddings_cache(cache_path);
  std::vector<std::string> keys;
  size_t hits = 0;
  for (const auto& prompt : request.prompts) {
    keys.push_back(io::embedding_cache_key(prompt, request.max_sequence_length, dtype, fingerprint));
    hits += entries.count(keys.back());
  }
  if (hits == request.prompts.size()) {
    std::vector<at::Tensor> embeds, pooled;
    for (const auto& key : keys) {
      embeds.push_back(from_raw(entries.at(key).prompt_embeds, request.device));
      pooled.push_back(from_raw(entries.at(key).pooled, request.device));
    }
    pipeline::PromptEmbeddings out;
    // One row per image, the images of the first prompt first, as encode_prompts gives them.
    out.prompt_embeds = at::cat(embeds, 0).repeat_interleave(request.num_images_per_prompt, 0);
    out.pooled = at::cat(pooled, 0).repeat_interleave(request.num_images_per_prompt, 0);
    out.text_ids = at::zeros({request.max_sequence_length, 3}, at::TensorOptions().device(request.device));
    DP_INFO("embeddings cache: all ", hits, " prompt(s) found in ", cache_path, "; CLIP and T5 not run");
    return out;
  }
  // Some prompts are new: encode the request as a run without the cache would, so the result is the same.
  auto out = flux.encode_prompts(request);
  size_t added = 0;
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    if (entries.count(keys[i])) continue;
    const int64_t row = static_cast<int64_t>(i) * request.num_images_per_prompt;
    io::CachedEmbedding e;
    e.prompt = request.prompts[i];
    e.max_sequence_length = request.max_sequence_length;
    e.dtype = dtype;
    e.encoder_fingerprint = fingerprint;
    e.prompt_embeds = to_raw(out.prompt_embeds.narrow(0, row, 1));
    e.pooled = to_raw(out.pooled.narrow(0, row, 1));
    entries[keys[i]] = std::move(e);
    ++added;
  }
  io::write_embeddings_cache(cache_path, entries);
  DP_INFO("embeddings cache: ", hits, " of ", request.prompts.size(), " prompt(s) found in ", cache_path,
          "; CLIP and T5 run; ", added, " entr", added == 1 ? "y" : "ies", " added");
  return out;
}

}  // namespace dp::runtime
