#include "models/flux/flux_transformer.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/json_file.h"
#include "models/flux/flux_fused.h"
#include "models/flux/fp8_gemm.h"
#include "models/flux/flux_layers.h"

namespace dp::models {

FluxTransformer FluxTransformer::load(const std::string& component_dir, at::ScalarType dtype, at::Device device,
                                      FluxParts parts, std::shared_ptr<const LoraSet> lora) {
  const std::string config_path = (std::filesystem::path(component_dir) / "config.json").string();
  const FluxConfig config = FluxConfig::from_json(read_json_file(config_path), config_path);
  auto weights = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(component_dir));
  return load(std::move(weights), config, dtype, device, parts, std::move(lora));
}

FluxTransformer FluxTransformer::load(std::shared_ptr<const io::WeightIndex> weights, const FluxConfig& config,
                                      at::ScalarType dtype, at::Device device, FluxParts parts,
                                      std::shared_ptr<const LoraSet> lora, WeightSource source) {
  if (parts.last_block < 0) parts.last_block = config.num_blocks();
  const bool zeros = source == WeightSource::zeros;
  DP_CHECK(!zeros || (parts.offloaded.empty() && !lora), "a model of zeros holds no offloaded blocks or adapters");
  DP_CHECK(parts.first_block >= 0 && parts.first_block <= parts.last_block && parts.last_block <= config.num_blocks(),
           "block range [", parts.first_block, ", ", parts.last_block, ") is outside the model's ", config.num_blocks(),
           " blocks");
  FluxTransformer model;
  model.config_ = config;
  model.parts_ = parts;
  model.dtype_ = dtype;
  model.device_ = device;
  model.lora_ = LoraBinding::make(std::move(lora), io::LoraComponent::transformer);
  // The global block a tensor belongs to ([0, num_layers) double, then single), or -1 outside the blocks.
  const auto block_of = [&](const std::string& name) -> int64_t {
    const auto numbered = [&](const std::string& prefix, int64_t base) -> int64_t {
      if (name.compare(0, prefix.size(), prefix) != 0) return -1;
      return base + std::atoll(name.c_str() + prefix.size());
    };
    const int64_t block = numbered("transformer_blocks.", 0);
    return block >= 0 ? block : numbered("single_transformer_blocks.", config.num_layers);
  };
  // Only the tensors this piece holds on the device are read ahead: its blocks that are not offloaded, and the
  // embedders and head when it holds them.
  const auto held = [&](const std::string& name) {
    const int64_t block = block_of(name);
    if (block >= 0) return block >= parts.first_block && block < parts.last_block && parts.offloaded.count(block) == 0;
    const bool head = name.rfind("norm_out.", 0) == 0 || name.rfind("proj_out.", 0) == 0;
    return head ? parts.head : parts.embedders;
  };
  // FP8 GEMMs for the blocks held on the device; streamed blocks keep their checkpoint's dtype. Converted blocks
  // are read ahead a part at a time (io::LoadPolicy::converting_part_bytes) and converted before the next part
  // is read, so the device never holds the whole range in the run dtype beside its FP8 copy.
  const bool fp8 = flux::fp8_gemms_enabled();
  if (fp8) flux::check_fp8_gemms_supported(dtype, device);
  const ModuleWeights from_files = ModuleWeights(weights, dtype, device).with_lora(model.lora_);
  const ModuleWeights scope = zeros ? from_files.with_zeros() : from_files;
  const ModuleWeights root = scope.read_ahead([&](const std::string& name) {
    return held(name) && !(fp8 && block_of(name) >= 0);
  });
  std::vector<uint64_t> block_bytes(static_cast<size_t>(config.num_blocks()), 0);
  if (fp8) {
    for (const auto& name : weights->names())
      if (const int64_t block = block_of(name); block >= 0 && block < config.num_blocks() && held(name))
        block_bytes[static_cast<size_t>(block)] += weights->info(name).nbytes();
  }
  const uint64_t part_bytes = io::load_policy().converting_part_bytes;
  ModuleWeights part = root;
  int64_t part_end = parts.first_block;  // the part read ahead covers blocks [.., part_end)
  const auto read_part_from = [&](int64_t first) {
    uint64_t bytes = 0;
    part_end = first;
    for (; part_end < parts.last_block; ++part_end) {
      const uint64_t next = block_bytes[static_cast<size_t>(part_end)];
      if (part_end > first && bytes + next > part_bytes) break;
      bytes += next;
    }
    part = scope.read_ahead([&](const std::string& name) {
      const int64_t block = block_of(name);
      return block >= first && block < part_end && held(name);
    });
  };
  const int64_t dim = config.inner_dim();
  if (parts.embedders) {
    model.x_embedder_ = Linear::load(root, "x_embedder", config.in_channels, dim);
    model.context_embedder_ = Linear::load(root, "context_embedder", config.joint_attention_dim, dim);
    const ModuleWeights tte = root.child("time_text_embed");
    model.time_linear_1_ = Linear::load(tte, "timestep_embedder.linear_1", 256, dim);
    model.time_linear_2_ = Linear::load(tte, "timestep_embedder.linear_2", dim, dim);
    if (config.guidance_embeds) {
      model.guidance_linear_1_ = Linear::load(tte, "guidance_embedder.linear_1", 256, dim);
      model.guidance_linear_2_ = Linear::load(tte, "guidance_embedder.linear_2", dim, dim);
    }
    model.text_linear_1_ = Linear::load(tte, "text_embedder.linear_1", config.pooled_projection_dim, dim);
    model.text_linear_2_ = Linear::load(tte, "text_embedder.linear_2", dim, dim);
  }
  for (const auto& [b, where] : parts.offloaded)
    DP_CHECK(b >= parts.first_block && b < parts.last_block, "offloaded block ", b, " is outside the held range [",
             parts.first_block, ", ", parts.last_block, ")");
  // Streamed on the CPU too (to the host), so that every CPU test of an offloading map runs the same slots,
  // prefetch and copies as a GPU.
  std::map<int64_t, OffloadedWeights> streamed = parts.offloaded;
  for (int64_t b = parts.first_block; b < parts.last_block; ++b) {
    if (streamed.count(b)) {
      // A placeholder keeps the vectors indexed by block; the weights come from offloaded_ per use.
      if (b < config.num_layers) model.double_blocks_.emplace_back();
      else model.single_blocks_.emplace_back();
      continue;
    }
    if (fp8 && b >= part_end) read_part_from(b);
    const ModuleWeights& from = fp8 ? part : root;
    if (b < config.num_layers) {
      auto block = flux::DoubleBlock::load(from.child("transformer_blocks." + std::to_string(b)), config);
      model.double_blocks_.push_back(fp8 ? flux::to_fp8(block) : std::move(block));
    } else {
      const int64_t s = b - config.num_layers;
      auto block = flux::SingleBlock::load(from.child("single_transformer_blocks." + std::to_string(s)), config);
      model.single_blocks_.push_back(fp8 ? flux::to_fp8(block) : std::move(block));
    }
  }
  if (!streamed.empty()) model.offloaded_ = std::make_shared<OffloadedBlocks>(root.without_read_ahead(), config, std::move(streamed));
  if (parts.head) {
    model.norm_out_ = Linear::load(root, "norm_out.linear", dim, 2 * dim);
    model.proj_out_ = Linear::load(root, "proj_out", dim, config.patch_size * config.patch_size * config.output_channels());
  }
  return model;
}

void FluxTransformer::require(bool held, const char* what) const {
  DP_CHECK(held, "this FluxTransformer instance was built without ", what, " (it holds blocks [", parts_.first_block,
           ", ", parts_.last_block, "))");
}

at::Tensor FluxTransformer::embed_text(const at::Tensor& encoder_hidden_states) const {
  require(parts_.embedders, "the embedders");
  return context_embedder_(encoder_hidden_states.to(device_, dtype_));
}

at::Tensor FluxTransformer::embed_image(const at::Tensor& hidden_states) const {
  require(parts_.embedders, "the embedders");
  return x_embedder_(hidden_states.to(device_, dtype_));
}

at::Tensor FluxTransformer::embed_time(const at::Tensor& timestep, const at::Tensor& guidance,
                                       const at::Tensor& pooled) const {
  require(parts_.embedders, "the embedders");
  DP_CHECK(guidance.defined() == config_.guidance_embeds,
           config_.guidance_embeds ? "this transformer has a guidance embedding: pass a guidance scale"
                                   : "this transformer has no guidance embedding: guidance must not be given");
  // diffusers rounds t (and guidance) to the run dtype before scaling by 1000: bf16 runs see bf16 timesteps.
  auto embed_scalar = [&](const at::Tensor& value, const Linear& first, const Linear& second) {
    const at::Tensor scaled = value.to(device_, dtype_) * 1000;
    return second(at::silu(first(flux::timestep_features(scaled).to(dtype_))));
  };
  at::Tensor temb = embed_scalar(timestep, time_linear_1_, time_linear_2_);
  if (config_.guidance_embeds) temb = temb + embed_scalar(guidance, guidance_linear_1_, guidance_linear_2_);
  const at::Tensor pooled_emb = text_linear_2_(at::silu(text_linear_1_(pooled.to(device_, dtype_))));
  return temb + pooled_emb;
}

FluxActivations FluxTransformer::embed(const FluxInputs& in) const {
  return {embed_image(in.hidden_states), embed_text(in.encoder_hidden_states),
          embed_time(in.timestep, in.guidance, in.pooled_projections)};
}

flux::RotaryTables FluxTransformer::rotary(const at::Tensor& txt_ids, const at::Tensor& img_ids) const {
  DP_CHECK(txt_ids.dim() == 2 && img_ids.dim() == 2, "txt_ids and img_ids must be 2-D (S, 3), got ", txt_ids.sizes(),
           " and ", img_ids.sizes());
  return flux::rotary_tables(at::cat({txt_ids, img_ids}, 0).to(device_), config_.axes_dims_rope);
}

uint64_t ModulationTable::nbytes() const {
  uint64_t total = 0;
  for (const auto& [block, rows] : blocks)
    total += rows.image.nbytes() + (rows.text.defined() ? rows.text.nbytes() : 0);
  return total;
}

flux::BlockModulation ModulationTable::at(int64_t block, int64_t step) const {
  DP_CHECK(step >= 0 && step < steps, "step ", step, " of a modulation table of ", steps, " steps");
  const auto found = blocks.find(block);
  if (found == blocks.end()) return {};
  return found->second.rows(step * rows_per_step, rows_per_step);
}

ModulationTable FluxTransformer::modulation_table(const std::vector<at::Tensor>& tembs) const {
  DP_CHECK(!tembs.empty(), "a modulation table needs at least one step's temb");
  const int64_t rows = tembs.front().size(0);
  std::vector<at::Tensor> acts;
  for (const auto& temb : tembs) {
    DP_CHECK(temb.dim() == 2 && temb.size(0) == rows && temb.size(1) == config_.inner_dim(), "temb ", temb.sizes(),
             " among steps of ", rows, " rows of ", config_.inner_dim());
    // silu step by step, on the same (B, D) shape the blocks see a step at a time.
    acts.push_back(at::silu(temb.to(device_, dtype_)));
  }
  const at::Tensor act = at::cat(acts, 0);
  ModulationTable table{static_cast<int64_t>(tembs.size()), rows};
  for (int64_t b = std::max<int64_t>(parts_.first_block, 0); b < parts_.last_block; ++b) {
    if (offloaded_ && offloaded_->holds(b)) continue;
    if (b < config_.num_layers) {
      table.blocks[b] = double_blocks_[static_cast<size_t>(b - parts_.first_block)].modulation(act, rows);
    } else {
      const int64_t first_single = std::max(parts_.first_block, config_.num_layers);
      table.blocks[b] = single_blocks_[static_cast<size_t>(b - first_single)].modulation(act, rows);
    }
  }
  return table;
}

void FluxTransformer::run_blocks(FluxActivations& state, const flux::RotaryTables& rope, int64_t first,
                                 int64_t last, const flux::SequenceShard* shard, const ModulationTable* table,
                                 int64_t step) const {
  DP_CHECK(first >= parts_.first_block && last <= parts_.last_block && first <= last, "blocks [", first, ", ", last,
           ") requested but this instance holds [", parts_.first_block, ", ", parts_.last_block, ")");
  DP_CHECK(rope.cos.size(0) == state.text.size(1) + state.image.size(1), "rotary tables cover ", rope.cos.size(0),
           " positions but the state has ", state.text.size(1), " text + ", state.image.size(1), " image tokens");
  DP_CHECK(table == nullptr || table->rows_per_step == state.temb.size(0), "a modulation table of ",
           table == nullptr ? 0 : table->rows_per_step, " rows a step for a state of ", state.temb.size(0), " rows");
  for (int64_t b = first; b < last; ++b) {
    const flux::BlockModulation rows = table == nullptr ? flux::BlockModulation{} : table->at(b, step);
    if (offloaded_ && offloaded_->holds(b)) {
      offloaded_->forward(b, state.image, state.text, state.temb, rope, shard);
    } else if (b < config_.num_layers) {
      const auto& block = double_blocks_[static_cast<size_t>(b - parts_.first_block)];
      if (rows.image.defined()) block.forward(state.image, state.text, rows, rope, shard);
      else block.forward(state.image, state.text, state.temb, rope, shard);
    } else {
      const int64_t first_single = std::max(parts_.first_block, config_.num_layers);
      const auto& block = single_blocks_[static_cast<size_t>(b - first_single)];
      if (rows.image.defined()) block.forward(state.image, state.text, rows, rope, shard);
      else block.forward(state.image, state.text, state.temb, rope, shard);
    }
  }
}

at::Tensor FluxTransformer::head(const FluxActivations& state) const {
  require(parts_.head, "the output head");
  const auto mod = norm_out_(at::silu(state.temb).to(dtype_)).chunk(2, 1);  // AdaLayerNormContinuous: scale, shift
  const at::Tensor normed = flux::layer_norm_modulate(state.image, mod[1], mod[0]);
  return proj_out_(normed);
}

void FluxTransformer::select_adapters(const std::vector<int64_t>& choice_per_row) const {
  if (lora_) lora_->select_rows(choice_per_row);
}

OffloadStats FluxTransformer::offload_stats() const { return offloaded_ ? offloaded_->stats() : OffloadStats{}; }

at::Tensor FluxTransformer::forward(const FluxInputs& inputs) const {
  require(parts_.embedders && parts_.head && parts_.first_block == 0 && parts_.last_block == config_.num_blocks(),
          "every part (forward needs the whole model)");
  FluxActivations state = embed(inputs);
  const flux::RotaryTables rope = rotary(inputs.txt_ids, inputs.img_ids);
  run_blocks(state, rope, 0, config_.num_blocks());
  return head(state);
}

}  // namespace dp::models
