#include "pipeline/flux_stage.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <memory>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "models/flux/flux_fused.h"
#include "models/lora_check.h"
#include "pipeline/device_stats.h"

namespace dp::pipeline {
namespace {

// The checkpoint bytes behind the modules `parts` holds: what loading this piece reads from disk. Without
// `with_offloaded`, only what it reads onto its device.
uint64_t held_bytes(const io::WeightIndex& weights, const models::FluxConfig& config, const models::FluxParts& parts,
                    bool with_offloaded) {
  const auto block_of = [&](const std::string& name) -> int64_t {
    for (const auto& [prefix, offset] : {std::pair<std::string, int64_t>{"transformer_blocks.", 0},
                                         std::pair<std::string, int64_t>{"single_transformer_blocks.", config.num_layers}}) {
      if (name.rfind(prefix, 0) != 0) continue;
      return offset + std::stoll(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size()));
    }
    return -1;
  };
  uint64_t bytes = 0;
  for (const auto& name : weights.names()) {
    const int64_t block = block_of(name);
    const bool head = name.rfind("norm_out.", 0) == 0 || name.rfind("proj_out.", 0) == 0;
    const bool held = block >= 0 ? (block >= parts.first_block && block < parts.last_block &&
                                    (with_offloaded || parts.offloaded.count(block) == 0))
                                 : (head ? parts.head : parts.embedders);
    if (held) bytes += weights.info(name).nbytes();
  }
  return bytes;
}

models::FluxConfig read_flux_config(const std::string& transformer_dir) {
  const std::string config_path = (std::filesystem::path(transformer_dir) / "config.json").string();
  return models::FluxConfig::from_json(read_json_file(config_path), config_path);
}

models::FluxParts parts_of(const models::FluxConfig& config, int64_t first_block, int64_t last_block,
                           const std::map<int64_t, models::OffloadedWeights>& offloaded) {
  models::FluxParts parts;
  parts.first_block = first_block;
  parts.last_block = last_block < 0 ? config.num_blocks() : last_block;
  parts.embedders = first_block == 0;
  parts.head = parts.last_block == config.num_blocks();
  parts.offloaded = offloaded;
  return parts;
}

}  // namespace

uint64_t FluxStage::device_weight_bytes(const std::string& transformer_dir, int64_t first_block, int64_t last_block,
                                        const std::map<int64_t, models::OffloadedWeights>& offloaded) {
  const auto config = read_flux_config(transformer_dir);
  return held_bytes(io::WeightIndex::open_dir(transformer_dir), config,
                    parts_of(config, first_block, last_block, offloaded), false);
}

FluxStage::FluxStage(const std::string& transformer_dir, int64_t first_block, int64_t last_block, at::ScalarType dtype,
                     at::Device device, const LatentGrid& grid, int64_t text_tokens,
                     const std::map<int64_t, models::OffloadedWeights>& offloaded,
                     models::flux::SequenceShard shard, std::shared_ptr<const models::LoraSet> lora,
                     models::WeightSource source)
    : shard_(std::move(shard)) {
  c10::InferenceMode guard;
  const auto config = read_flux_config(transformer_dir);
  const models::FluxParts parts = parts_of(config, first_block, last_block, offloaded);
  auto weights = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(transformer_dir));
  weight_bytes_ = held_bytes(*weights, config, parts, true);
  if (lora) {
    // A NaN in an adapter is found before the blocks load, reading only the factors this piece will use.
    lora->check_finite(io::LoraComponent::transformer, [&](const io::LoraModule& m) {
      if (m.block >= 0) return m.block >= parts.first_block && m.block < parts.last_block;
      return models::flux_module_is_embedder(m.module) ? parts.embedders : parts.head;
    });
  }
  model_ = models::FluxTransformer::load(std::move(weights), config, dtype, device, parts, std::move(lora), source);
  if (shard_.text_counts.empty()) shard_ = {0, {text_tokens}, {grid.tokens()}, nullptr};
  shard_.check();
  DP_CHECK(shard_.text_tokens() == text_tokens && shard_.image_tokens() == grid.tokens(), "a sequence shard of ",
           shard_.text_tokens(), " text and ", shard_.image_tokens(), " image tokens for a sequence of ", text_tokens,
           " and ", grid.tokens());
  DP_CHECK(config.num_attention_heads % shard_.size() == 0, "a sequence group of ", shard_.size(),
           " ranks splits whole heads, and the transformer has ", config.num_attention_heads);
  // Every rank computes the whole sequence's tables and keeps the rows of its own tokens.
  const at::Tensor txt_ids = at::zeros({text_tokens, 3}, at::TensorOptions().device(device));
  rope_ = models::flux::shard_rotary(model_.rotary(txt_ids, latent_image_ids(grid).to(device)), shard_);
}

void FluxStage::set_prompts(int64_t microbatch, const at::Tensor& prompt_embeds, const at::Tensor& pooled) {
  DP_CHECK(is_first(), "microbatch ", microbatch, ": prompts sent to a stage that does not start at block 0");
  DP_CHECK(prompt_embeds.dim() == 3 && prompt_embeds.size(1) == text_count(), "microbatch ", microbatch,
           ": prompt embeddings ", prompt_embeds.sizes(), " for a stage that holds ", text_count(), " text tokens");
  c10::InferenceMode guard;
  const auto device = model_.device();
  if (model_.has_unfused_adapters())
    prompts_[microbatch] = {at::Tensor(), pooled.to(device, model_.dtype()), prompt_embeds.to(device, model_.dtype()),
                            {}};
  else
    prompts_[microbatch] = {model_.embed_text(prompt_embeds.to(device, model_.dtype())), pooled.to(device, model_.dtype()),
                            at::Tensor(), {}};
}

bool FluxStage::takes_schedule() const {
  return is_first() && !model_.has_unfused_adapters() && models::flux::modulation_table_enabled(model_.device());
}

bool FluxStage::set_schedule(int64_t microbatch, const StepSchedule& schedule) {
  DP_CHECK(is_first(), "microbatch ", microbatch, ": a schedule sent to a stage that does not start at block 0");
  const auto found = prompts_.find(microbatch);
  DP_CHECK(found != prompts_.end(), "microbatch ", microbatch, ": a schedule before its prompts");
  if (schedule.timesteps.empty() || !takes_schedule()) return false;
  const int64_t rows = found->second.pooled.size(0);
  // What the table would take: 12 dim a row for a double block (norm1 and norm1_context), 3 dim for a single
  // block, for each step and row in the run dtype; offloaded blocks compute theirs a step at a time.
  const auto& config = model_.config();
  const auto& parts = model_.parts();
  int64_t widths = 0;
  for (int64_t b = parts.first_block; b < parts.last_block; ++b)
    if (parts.offloaded.count(b) == 0) widths += b < config.num_layers ? 12 : 3;
  const auto wanted = static_cast<uint64_t>(widths * config.inner_dim() * rows) * schedule.timesteps.size() *
                      c10::elementSize(model_.dtype());
  uint64_t kept = 0;
  for (const auto& [id, prompts] : prompts_) kept += prompts.modulation.nbytes();
  if (kept + wanted > kModulationTableBudgetBytes) return false;
  c10::InferenceMode guard;
  const auto device = model_.device();
  const at::Tensor guidance = schedule.guidance.defined() ? schedule.guidance.to(device) : at::Tensor();
  std::vector<at::Tensor> tembs;
  for (const auto& timestep : schedule.timesteps) {
    DP_CHECK(timestep.dim() == 1 && timestep.size(0) == rows, "microbatch ", microbatch, ": a schedule's timestep ",
             timestep.sizes(), " for ", rows, " rows");
    // As run() computes a step's temb from its inputs.
    tembs.push_back(model_.embed_time(timestep.to(device), guidance, found->second.pooled));
  }
  const auto started = std::chrono::steady_clock::now();
  found->second.modulation = model_.modulation_table(tembs);
  DP_DEBUG("microbatch ", microbatch, ": the modulation rows of ", schedule.timesteps.size(), " steps for ",
           found->second.modulation.blocks.size(), " blocks, ", std::fixed, std::setprecision(1),
           static_cast<double>(found->second.modulation.nbytes()) / (1 << 20), " MiB, queued in ",
           std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count(), " ms");
  return true;
}

void FluxStage::forget(int64_t microbatch) { prompts_.erase(microbatch); }

double FluxStage::warm_up(int64_t batch, int steps) const {
  if (model_.has_unfused_adapters()) return 0;
  c10::InferenceMode guard;
  const auto started = std::chrono::steady_clock::now();
  const auto& parts = model_.parts();
  const int64_t layers = model_.config().num_layers;
  const auto options = at::TensorOptions().dtype(model_.dtype()).device(model_.device());
  const int64_t dim = model_.config().inner_dim();
  const auto run_one = [&](int64_t first, int64_t last) {
    for (int64_t b = std::max(first, parts.first_block); b < std::min(last, parts.last_block); ++b) {
      if (parts.offloaded.count(b)) continue;
      models::FluxActivations state{at::zeros({batch, image_count(), dim}, options),
                                    at::zeros({batch, text_count(), dim}, options), at::zeros({batch, dim}, options)};
      model_.run_blocks(state, rope_, b, b + 1, nullptr);
      return;
    }
  };
  run_one(0, layers);                          // a double block
  run_one(layers, model_.config().num_blocks());  // a single block
  // The parts around the blocks have GEMM shapes and kernels of their own (the embedders, the timestep features,
  // the head): left to step 1 they made it 1.14-1.19x a later step on an H100 (bench/RESULTS.md, 2026-12-05).
  const auto& config = model_.config();
  if (is_first()) {
    (void)model_.embed_text(at::zeros({batch, text_count(), config.joint_attention_dim}, options));
    (void)model_.embed_image(at::zeros({batch, image_count(), config.in_channels}, options));
    const at::Tensor guidance = config.guidance_embeds ? at::zeros({batch}, options.dtype(at::kFloat)) : at::Tensor();
    (void)model_.embed_time(at::zeros({batch}, options), guidance, at::zeros({batch, config.pooled_projection_dim}, options));
    // The table's kernel for steps x batch rows (loaded lazily) and its shapes, ready for step 1. On an H100 step 1
    // was 1.13-1.19x a later step with the table on and no such warm-up, 1.21-1.22x with it and the table's kernel
    // cut differently: the table's 13 ms explain half of it, the rest is not traced yet (bench/RESULTS.md,
    // session 23).
    if (takes_schedule() && steps > 0) {
      const std::vector<at::Tensor> tembs(static_cast<size_t>(steps), at::zeros({batch, dim}, options));
      (void)model_.modulation_table(tembs);
    }
  }
  if (is_last()) {
    models::FluxActivations state{at::zeros({batch, image_count(), dim}, options),
                                  at::zeros({batch, text_count(), dim}, options), at::zeros({batch, dim}, options)};
    (void)model_.head(state);
  }
  synchronize(model_.device());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

std::vector<at::Tensor> FluxStage::run(int64_t microbatch, const std::vector<at::Tensor>& inputs, int step) const {
  c10::InferenceMode guard;
  const auto device = model_.device();
  models::FluxActivations state;
  // A last (B,) int64 tensor: each row's adapter choice (prompts that pick their own LoRA adapters).
  const bool choices = inputs.size() == 4;
  if (choices) {
    const at::Tensor ids = inputs[3].to(at::kCPU, at::kLong).contiguous();
    DP_CHECK(ids.dim() == 1 && ids.size(0) == inputs[0].size(0), "microbatch ", microbatch, ": adapter choices ",
             ids.sizes(), " for a batch of ", inputs[0].size(0));
    model_.select_adapters(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()));
  }
  if (is_first()) {
    DP_CHECK(inputs.size() == 3 || choices, "microbatch ", microbatch,
             ": the first stage expects latents, timestep and guidance, got ", inputs.size(), " tensors");
    const auto found = prompts_.find(microbatch);
    DP_CHECK(found != prompts_.end(), "microbatch ", microbatch, ": no prompts were sent before its first step");
    if (!found->second.text.defined()) {
      // Embedded once, now that the rows' adapter choice is selected.
      found->second.text = model_.embed_text(found->second.unembedded);
      found->second.unembedded = at::Tensor();
    }
    const at::Tensor latents = inputs[0].to(device);
    const at::Tensor guidance = inputs[2].defined() ? inputs[2].to(device) : at::Tensor();
    state = {model_.embed_image(latents), found->second.text,
             model_.embed_time(inputs[1].to(device), guidance, found->second.pooled)};
  } else {
    DP_CHECK(inputs.size() == 3 || choices, "microbatch ", microbatch,
             ": a stage expects image, text and temb activations, got ", inputs.size(), " tensors");
    state = {inputs[0].to(device), inputs[1].to(device), inputs[2].to(device)};
  }
  DP_CHECK(state.image.dim() == 3 && state.image.size(1) == image_count() && state.text.dim() == 3 &&
               state.text.size(1) == text_count(),
           "microbatch ", microbatch, ": ", state.image.sizes(), " image and ", state.text.sizes(), " text rows for a ",
           "stage that holds ", image_count(), " image and ", text_count(), " text tokens");
  const models::ModulationTable* table = nullptr;
  if (is_first()) {
    const auto& modulation = prompts_.at(microbatch).modulation;
    if (step >= 0 && step < modulation.steps) table = &modulation;
  }
  model_.run_blocks(state, rope_, model_.parts().first_block, model_.parts().last_block, group(), table, step);
  if (is_last()) return {model_.head(state)};
  if (choices) return {state.image, state.text, state.temb, inputs[3]};
  return {state.image, state.text, state.temb};
}

}  // namespace dp::pipeline
