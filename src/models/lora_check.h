#pragma once
// LoRA adapters fitted to a model's configs, without LibTorch: every module an adapter names must be a Linear
// of FluxPipeline's transformer or of its CLIP text encoder, with factors of the Linear's width. `inspect
// --lora`, generate's preflight and the fuzz target run this before any weight is read.
#include <cstdint>
#include <string>

#include "io/lora_file.h"
#include "models/clip/clip_config.h"
#include "models/flux/flux_config.h"

namespace dp::models {

// Checks each module of `file` against the transformer's config (and CLIP's for text-encoder modules; `clip`
// may be null when the pipeline has none, which refuses a file with text-encoder keys) and fills in its block
// (double blocks first, as FluxTransformer numbers them), and for a split fused projection its rows of the up
// factor. Throws naming the file, the key and the expected shape.
void fit_lora_to_model(io::LoraFile& file, const FluxConfig& flux, const ClipTextConfig* clip);

// Where a transformer module lives: its global block index, or -1 for the embedders and the output head.
int64_t flux_module_block(const std::string& module, const FluxConfig& config);
// True for x_embedder, context_embedder and time_text_embed.* (the first stage's), false for blocks and head.
bool flux_module_is_embedder(const std::string& module);

}  // namespace dp::models
