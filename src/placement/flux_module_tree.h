#pragma once
// FluxTransformer2DModel's module tree, built from its config the way diffusers registers the modules
// (parameter-less ones such as pos_embed, activations and dropout included), sized from safetensors
// headers at the run dtype.
#include <string>

#include "io/safetensors.h"
#include "io/weight_index.h"
#include "models/flux/flux_config.h"
#include "placement/module_tree.h"

namespace dp::placement {

// Bytes one tensor occupies once loaded for a run in `run_dtype`: floating tensors are converted to the run
// dtype, integer and bool tensors keep their own (as accelerate's compute_module_sizes counts them on a
// model built under the run dtype).
int64_t bytes_at_run_dtype(io::DType stored, uint64_t numel, io::DType run_dtype);

// How the blocks' projection weights are held: as loaded (the run dtype), or converted to FP8 by --fp8-gemms
// (models::flux_fp8_gemm_weight), one byte an element and an fp32 scale per row.
enum class BlockWeights { run_dtype, fp8_gemms };

// Sizes from the config alone: every parameter at the run dtype (or FP8, as `blocks` says).
ModuleTree flux_module_tree(const models::FluxConfig& config, io::DType run_dtype,
                            BlockWeights blocks = BlockWeights::run_dtype);

// Sizes from the checkpoint headers in `weights`. Every header tensor must be a parameter of the model with
// the shape the config implies, and every parameter must be present; errors name the folder and tensor.
ModuleTree flux_module_tree(const models::FluxConfig& config, const io::WeightIndex& weights, io::DType run_dtype,
                            BlockWeights blocks = BlockWeights::run_dtype);

// The largest block's bytes in `tree` (0 without blocks). Under --fp8-gemms a block is read at the run dtype and
// converted in place, so each GPU keeps this much of a run-dtype tree free for the conversion.
int64_t flux_largest_block_bytes(const models::FluxConfig& config, const ModuleTree& tree);

}  // namespace dp::placement
