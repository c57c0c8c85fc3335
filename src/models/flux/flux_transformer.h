#pragma once
// FluxTransformer2DModel in LibTorch. A pipeline stage builds it with only the parts it owns (a block range,
// and optionally the embedders and the output head), and runs blocks [first, last) on an activation state.
// The whole-model forward is exactly the composition of those pieces.
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/weight_index.h"
#include "models/flux/flux_blocks.h"
#include "models/flux/flux_config.h"
#include "models/flux/flux_offload.h"
#include "models/lora.h"

namespace dp::models {

// What travels between pipeline stages. Blocks are numbered globally: [0, num_layers) are the double
// blocks (transformer_blocks.i), [num_layers, num_blocks) the single blocks (single_transformer_blocks.j).
struct FluxActivations {
  at::Tensor image;  // (B, N_img, D)
  at::Tensor text;   // (B, N_txt, D)
  at::Tensor temb;   // (B, D)
};

struct FluxInputs {
  at::Tensor hidden_states;          // (B, N_img, in_channels) packed latents
  at::Tensor encoder_hidden_states;  // (B, N_txt, joint_attention_dim)
  at::Tensor pooled_projections;     // (B, pooled_projection_dim)
  at::Tensor timestep;               // (B,) in [0, 1]; the model scales by 1000
  at::Tensor img_ids;                // (N_img, 3)
  at::Tensor txt_ids;                // (N_txt, 3)
  at::Tensor guidance;               // (B,) or undefined when the config has no guidance embedding
};

// The modulation rows of every step of a schedule, for the blocks a model holds on its device: the AdaLayerNorm
// projections of silu(temb) read 3.2 billion of FLUX.1-dev's weights for a handful of rows, so computing all steps'
// rows in one pass reads them once a schedule instead of once a step (on CUDA, through flux::modulation_rows' kernel;
// elsewhere a step at a time). Row for row the same bits as the blocks compute a step at a time, so a rank with a
// table and a rank without agree.
struct ModulationTable {
  int64_t steps = 0;
  int64_t rows_per_step = 0;                             // the microbatch's batch rows
  std::map<int64_t, flux::BlockModulation> blocks = {};  // by global block index: (steps * rows_per_step, width)
  uint64_t nbytes() const;
  // Block `block`'s rows of `step`; undefined tensors when the table does not hold the block.
  flux::BlockModulation at(int64_t block, int64_t step) const;
};

// Which parts a FluxTransformer instance holds.
struct FluxParts {
  bool embedders = true;  // x_embedder, context_embedder, time_text_embed
  int64_t first_block = 0;
  int64_t last_block = -1;  // exclusive; -1 means all blocks
  bool head = true;         // norm_out, proj_out
  // Blocks of [first_block, last_block) a device map offloads to "cpu" or "disk". Their weights stay off the
  // device and are copied in per use (models/flux/flux_offload.h): to the GPU on CUDA; on the CPU into buffers
  // of their own, which gains nothing but runs the same streaming code.
  std::map<int64_t, OffloadedWeights> offloaded = {};
  static FluxParts all() { return {}; }
  static FluxParts blocks(int64_t first, int64_t last) { return {false, first, last, false}; }
};

// Where a loaded model's tensors come from: the checkpoint, or zeros of its shapes and dtypes, read from its
// headers only (ModuleWeights::with_zeros): a model to warm the kernels up with while the real weights stream.
enum class WeightSource { checkpoint, zeros };

class FluxTransformer {
 public:
  // Loads from a component folder (config.json + weights). Only tensors of the requested parts are read, and
  // only their LoRA factors when `lora` is given (merged or attached as its mode says, models/lora.h).
  static FluxTransformer load(const std::string& component_dir, at::ScalarType dtype, at::Device device,
                              FluxParts parts = FluxParts::all(), std::shared_ptr<const LoraSet> lora = nullptr);
  static FluxTransformer load(std::shared_ptr<const io::WeightIndex> weights, const FluxConfig& config,
                              at::ScalarType dtype, at::Device device, FluxParts parts = FluxParts::all(),
                              std::shared_ptr<const LoraSet> lora = nullptr,
                              WeightSource source = WeightSource::checkpoint);

  const FluxConfig& config() const { return config_; }
  const FluxParts& parts() const { return parts_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

  // The text stream input: the same at every step, so callers compute it once per prompt.
  at::Tensor embed_text(const at::Tensor& encoder_hidden_states) const;
  at::Tensor embed_image(const at::Tensor& hidden_states) const;
  at::Tensor embed_time(const at::Tensor& timestep, const at::Tensor& guidance, const at::Tensor& pooled) const;
  FluxActivations embed(const FluxInputs& inputs) const;
  // Needs no weights: every rank recomputes the tables for its sequence layout.
  flux::RotaryTables rotary(const at::Tensor& txt_ids, const at::Tensor& img_ids) const;
  // With a `shard` of several members, `state` holds this member's tokens (text and image shards) and `rope`
  // their rows (flux::shard_rotary); each block's attention still spans the whole sequence.
  // With a `table`, the blocks it holds take their modulation rows of `step` from it instead of computing them from
  // state.temb, which must then be the temb the table was made from for that step.
  void run_blocks(FluxActivations& state, const flux::RotaryTables& rope, int64_t first, int64_t last,
                  const flux::SequenceShard* shard = nullptr, const ModulationTable* table = nullptr,
                  int64_t step = 0) const;
  // `tembs`: one (B, D) temb per step, each as embed_time gives it for that step. Holds every block of this
  // instance but the offloaded ones (their weights are on the device only while they run).
  ModulationTable modulation_table(const std::vector<at::Tensor>& tembs) const;
  at::Tensor head(const FluxActivations& state) const;
  // Unfused LoRA: which of the LoRA set's adapter choices each row of the next forward uses (one index per
  // batch row); without a call every row uses the default. No effect without unfused adapters.
  void select_adapters(const std::vector<int64_t>& choice_per_row) const;
  bool has_unfused_adapters() const { return lora_ && lora_->rows; }
  // Copies of offloaded blocks so far; empty (all zero) when none are streamed.
  OffloadStats offload_stats() const;
  // Whole model; requires all parts.
  at::Tensor forward(const FluxInputs& inputs) const;

 private:
  void require(bool held, const char* what) const;

  FluxConfig config_;
  FluxParts parts_;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  Linear x_embedder_, context_embedder_;
  Linear time_linear_1_, time_linear_2_, guidance_linear_1_, guidance_linear_2_, text_linear_1_, text_linear_2_;
  std::vector<flux::DoubleBlock> double_blocks_;  // indexed from max(first_block, 0)
  std::vector<flux::SingleBlock> single_blocks_;
  // Streamed (offloaded) blocks; their entries in double_blocks_ / single_blocks_ hold no weights.
  std::shared_ptr<OffloadedBlocks> offloaded_;
  Linear norm_out_, proj_out_;
  std::shared_ptr<const LoraBinding> lora_;
};

}  // namespace dp::models
