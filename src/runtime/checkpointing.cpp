#include "runtime/checkpointing.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "core/human_units.h"
#include "io/checkpoint_dir.h"
#include "io/embeddings_cache_file.h"
#include "io/torch_tensors.h"
#include "pipeline/stage_timer.h"
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
  trace::Scope span(trace::Track::host, str("checkpoint copy step ", state.steps_done));  // --trace and NVTX
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
      trace::Scope span(trace::Track::checkpoint, str("checkpoint write step ", step));  // its own thread
      io::write_checkpoint(path, *c);
      io::prune_run_checkpoints(dir, c->run_id, keep);  // this run's files only; each removal logged
      // Written while later steps run: the line names the step the file holds, not the loop's current one.
      DP_INFO("checkpoint ", path, " written: every image at least at denoising step ", step, "/", steps, " when it "
              "was taken; ", human_seconds(copy_ms / 1000), " in the loop (host copy), ",
              human_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count()),
              " writing in the background");
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
  // Text-encoder adapters change CLIP's output: their fingerprint and each text's adapter choice join the key.
  const bool clip_adapters = request.lora && request.lora->touches(io::LoraComponent::text_encoder);
  const std::string fingerprint =
      encoder_fingerprint(flux.folder()) + (clip_adapters ? " lora " + request.lora->fingerprint() : std::string());
  const std::string dtype = io::run_dtype_name(request.dtype);
  const auto texts = request.encode_texts();
  auto entries = io::read_embeddings_cache(cache_path);
  std::vector<std::string> keys;
  size_t hits = 0;
  for (const auto& text : texts) {
    keys.push_back(io::embedding_cache_key(text.text, request.max_sequence_length, dtype,
                                           clip_adapters ? str(fingerprint, " choice ", text.adapters) : fingerprint));
    hits += entries.count(keys.back());
  }
  if (hits == texts.size()) {
    std::vector<at::Tensor> embeds, pooled;
    for (const auto& key : keys) {
      embeds.push_back(from_raw(entries.at(key).prompt_embeds, request.device));
      pooled.push_back(from_raw(entries.at(key).pooled, request.device));
    }
    DP_INFO("embeddings cache: all ", hits, " text(s) found in ", cache_path, "; CLIP and T5 not run");
    // One row per image, the images of the first prompt first, as encode_prompts gives them.
    auto out = pipeline::FluxPipeline::expand_per_image(request, at::cat(pooled, 0), at::cat(embeds, 0));
    out.text_ids = out.text_ids.to(request.device);
    return out;
  }
  // Some texts are new: encode the request as a run without the cache would, so the result is the same.
  at::Tensor pooled, t5;
  {
    pipeline::StageTimer timer("encode", request.device, flux.report_sink());
    auto encoded = flux.encode_both(request, request.device, timer);
    pooled = std::move(encoded.pooled);
    t5 = std::move(encoded.t5);
  }
  size_t added = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (entries.count(keys[i])) continue;
    const auto row = static_cast<int64_t>(i);
    io::CachedEmbedding e;
    e.prompt = texts[i].text;
    e.max_sequence_length = request.max_sequence_length;
    e.dtype = dtype;
    e.encoder_fingerprint = fingerprint;
    e.prompt_embeds = to_raw(t5.narrow(0, row, 1));
    e.pooled = to_raw(pooled.narrow(0, row, 1));
    entries[keys[i]] = std::move(e);
    ++added;
  }
  io::write_embeddings_cache(cache_path, entries);
  DP_INFO("embeddings cache: ", hits, " of ", texts.size(), " text(s) found in ", cache_path,
          "; CLIP and T5 run; ", added, " entr", added == 1 ? "y" : "ies", " added");
  return pipeline::FluxPipeline::expand_per_image(request, pooled, t5);
}

io::CheckpointRun checkpoint_run(const pipeline::GenerateRequest& request, int64_t microbatch_size, bool fp8_gemms) {
  io::CheckpointRun run;
  run.prompts = request.prompts;
  run.num_images_per_prompt = request.num_images_per_prompt;
  run.height = request.height;
  run.width = request.width;
  run.steps = request.steps;
  run.guidance = request.guidance;
  run.seed = request.seed;
  run.max_sequence_length = request.max_sequence_length;
  run.dtype = io::run_dtype_name(request.dtype);
  run.microbatch_size = microbatch_size;
  if (request.do_true_cfg()) {
    run.negative_prompts = request.negative_prompts;
    run.true_cfg_scale = request.true_cfg_scale;
  }
  run.custom_sigmas = request.sigmas;
  run.initial_latents = request.latents.defined() ? request.latents_source : std::string();
  if (request.lora) {
    nlohmann::ordered_json lora = {{"mode", models::lora_mode_name(request.lora->mode())},
                                   {"adapters", nlohmann::ordered_json::array()},
                                   {"fingerprint", request.lora->fingerprint()}};
    for (const auto& a : request.lora->adapters())
      lora["adapters"].push_back({{"name", a.spec.name}, {"path", fs::absolute(a.spec.path).string()}, {"scale", a.spec.scale}});
    run.lora = lora.dump();
  }
  // FP8 GEMMs round differently: resuming one setting's latents with the other would mix the two.
  run.set_fp8_gemms(fp8_gemms);
  return run;
}

void record_embeddings(io::Checkpoint& checkpoint, const pipeline::PromptEmbeddings& prompts) {
  checkpoint.prompt_embeds = to_raw(prompts.prompt_embeds);
  checkpoint.pooled = to_raw(prompts.pooled);
  if (prompts.negative_prompt_embeds.defined()) {
    checkpoint.negative_prompt_embeds = to_raw(prompts.negative_prompt_embeds);
    checkpoint.negative_pooled = to_raw(prompts.negative_pooled);
  }
}

pipeline::PromptEmbeddings embeddings_from_checkpoint(const io::Checkpoint& checkpoint, const at::Device& device) {
  pipeline::PromptEmbeddings prompts;
  prompts.prompt_embeds = from_raw(checkpoint.prompt_embeds, device);
  prompts.pooled = from_raw(checkpoint.pooled, device);
  if (checkpoint.negative_prompt_embeds.nbytes > 0) {
    prompts.negative_prompt_embeds = from_raw(checkpoint.negative_prompt_embeds, device);
    prompts.negative_pooled = from_raw(checkpoint.negative_pooled, device);
  }
  return prompts;
}

}  // namespace dp::runtime
