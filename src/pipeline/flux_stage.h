#pragma once
// One piece of the FLUX transformer as a denoising run uses it: blocks [first, last), plus the embedders when
// the piece starts at block 0 and the output head when it ends at the last block. A one-process run holds
// one piece with everything; a multi-rank run holds one piece per rank and passes what run() returns to the
// next rank. The payloads are plain tensor lists so that whoever moves them needs no FLUX knowledge:
//   first piece in:  [packed latents (B, N_img, C), timestep (B,) in [0, 1], guidance (B,) or undefined]
//   between pieces:  [image (B, N_img, D), text (B, N_txt, D), temb (B, D)]
//   last piece out:  [noise prediction (B, N_img, C)]
// When the piece is one of a sequence group's K members (models/flux/sequence_parallel.h), every tensor above
// holds this member's token shard only (N_img and N_txt its counts) and temb stays whole.
// When prompts choose their own LoRA adapters (unfused), the first two also carry a last tensor, each row's
// adapter choice (B,) int64, which every piece applies to its adapted Linears.
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "models/flux/flux_transformer.h"
#include "models/flux/sequence_parallel.h"
#include "pipeline/latent_layout.h"

namespace dp::pipeline {

// The transformer's timestep and guidance inputs of every step of one microbatch, exactly as the loop will pass
// them step by step (pipeline/denoise_loop.cpp).
struct StepSchedule {
  std::vector<at::Tensor> timesteps;  // one (B,) tensor per step, step 0 first
  at::Tensor guidance;                // (B,), or undefined without a guidance embedding
};

// The most bytes of modulation rows a stage keeps for the microbatches it holds; beyond it, rows a step at a time.
constexpr uint64_t kModulationTableBudgetBytes = 128ull << 20;

class FluxStage {
 public:
  // Reads only the tensors of blocks [first_block, last_block) (and of the embedders / head when held) from
  // the transformer folder. last_block -1 means the model's last block.
  // `offloaded`: blocks of the range the device map puts on "cpu" or "disk"; their weights stay in host memory
  // or in the mmapped file and are streamed in per use (models/flux/flux_offload.h), on the CPU too.
  // `shard`: this piece's place in its sequence group; empty counts (the default) or one member: the whole
  // sequence. Its exchange must outlive the stage.
  // `lora`: the run's adapters; this piece reads (and first checks for non-finite values) only the factors of
  // the modules it holds.
  // `source` zeros: nothing is read but the headers, every tensor is zero (a piece to warm up with, see warm_up).
  FluxStage(const std::string& transformer_dir, int64_t first_block, int64_t last_block, at::ScalarType dtype,
            at::Device device, const LatentGrid& grid, int64_t text_tokens,
            const std::map<int64_t, models::OffloadedWeights>& offloaded = {},
            models::flux::SequenceShard shard = {}, std::shared_ptr<const models::LoraSet> lora = nullptr,
            models::WeightSource source = models::WeightSource::checkpoint);

  bool is_first() const { return model_.parts().embedders; }
  bool is_last() const { return model_.parts().head; }
  int64_t first_block() const { return model_.parts().first_block; }
  int64_t last_block() const { return model_.parts().last_block; }
  const models::FluxConfig& config() const { return model_.config(); }
  // Bytes of the checkpoint tensors this piece read (its blocks, plus embedders / head when held).
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Before loading, from the headers: the file bytes a piece of [first_block, last_block) reads onto its device
  // (the blocks the map offloads stay off it), the embedders and head included when it holds them.
  static uint64_t device_weight_bytes(const std::string& transformer_dir, int64_t first_block, int64_t last_block,
                                      const std::map<int64_t, models::OffloadedWeights>& offloaded);
  // The offloaded blocks' copies to the device so far (all zero when none are streamed).
  models::OffloadStats offload_stats() const { return model_.offload_stats(); }

  // First piece only: a microbatch's prompt embeddings, embedded once (the text stream's input is the same at
  // every step) and kept with the pooled projection until forget().
  void set_prompts(int64_t microbatch, const at::Tensor& prompt_embeds, const at::Tensor& pooled);
  // First piece only, after set_prompts: the microbatch's timesteps and guidance for all its steps. When
  // models::flux::modulation_table_enabled and the rows fit kModulationTableBudgetBytes beside the other
  // microbatches', the blocks' modulation rows of every step are computed now, in one pass over their weights, and
  // run(..., step) takes its step's rows from them. Returns whether it made them.
  bool set_schedule(int64_t microbatch, const StepSchedule& schedule);
  // Whether set_schedule can make a table here: a first piece, no unfused LoRA adapters, the table enabled.
  bool takes_schedule() const;
  void forget(int64_t microbatch);

  // Runs one double and one single block of this piece (those it holds on the device) on zeros of a
  // `batch`-row microbatch at the run's token counts, so that the loop's first step finds cuBLAS/cuBLASLt handles
  // and heuristics, the attention kernels and CUDA's lazily loaded modules ready; the first stage also runs its
  // embedders and the last its head, and, when it takes a schedule, a modulation table of `steps` steps (the
  // table's kernel and shapes are the first step's too). Changes no state: the results
  // are dropped. Skipped with unfused LoRA adapters (they need a row choice) and never exchanges with a
  // sequence group (each rank warms its own shard's shapes). Returns the seconds it took.
  double warm_up(int64_t batch, int steps) const;

  // One step of one microbatch through this piece (see the payloads above). Inputs may live on any device.
  // `step`: the step's index in the schedule set_schedule was given; -1 (or no schedule): rows from the inputs.
  std::vector<at::Tensor> run(int64_t microbatch, const std::vector<at::Tensor>& inputs, int step = -1) const;

 private:
  struct Prompts {
    at::Tensor text;    // context_embedder output (B, N_txt, D)
    at::Tensor pooled;  // (B, pooled_projection_dim)
    // Unfused adapters: the prompt embeddings wait here for the first step, which says the rows' adapter choice
    // that context_embedder's adapters need.
    at::Tensor unembedded;
    // The blocks' modulation rows of every step (set_schedule); no steps when there is none.
    models::ModulationTable modulation;
  };
  // The tokens this piece holds: its shard's text and image counts.
  int64_t text_count() const { return shard_.text_counts[static_cast<size_t>(shard_.index)]; }
  int64_t image_count() const { return shard_.image_counts[static_cast<size_t>(shard_.index)]; }
  const models::flux::SequenceShard* group() const { return shard_.size() > 1 ? &shard_ : nullptr; }

  models::FluxTransformer model_;
  models::flux::SequenceShard shard_;
  models::flux::RotaryTables rope_;  // rows of this piece's tokens
  mutable std::map<int64_t, Prompts> prompts_;
  uint64_t weight_bytes_ = 0;
};

}  // namespace dp::pipeline
