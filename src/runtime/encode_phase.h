#pragma once
// The encode phase: CLIP and T5 run on the ranks the component map names (rank 0 without one), each loaded,
// run and freed in turn, and send their outputs to the coordinator. A resume runs no encoder (the embeddings
// are in the checkpoint) and the embeddings cache lives with the coordinator: then rank 0 takes the phase.
#include <ATen/ATen.h>

#include "pipeline/flux_pipeline.h"
#include "runtime/run_context.h"

namespace dp::runtime {

// The encoders' outputs as they reach the coordinator, one row per prompt (undefined on other ranks).
struct EncodedPrompts {
  at::Tensor pooled;   // CLIP's pooled output
  at::Tensor t5_rows;  // T5's embeddings
};

// Runs this rank's part of the phase; on the coordinator returns what the encoder ranks computed.
EncodedPrompts encode_phase(RunContext& run);

// What the coordinator's ring starts from: embeddings one row per image, on the host, and the batch's initial
// latents (from the encoders, the embeddings cache or the checkpoint resumed).
struct CoordinatorStart {
  pipeline::PromptEmbeddings prompts;
  at::Tensor latents;
};
CoordinatorStart coordinator_start(RunContext& run, EncodedPrompts encoded);

}  // namespace dp::runtime
