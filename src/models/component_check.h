#pragma once
// Is a model folder ready to run? Each component's config is parsed (exact types and the checks of its
// parser) and its safetensors headers are compared with the tensors that config implies: every tensor the
// LibTorch model reads must be stored, with that shape and a floating-point dtype. Headers only, no weights
// read: milliseconds even for FLUX.1-dev's 24 GB transformer, so `generate` runs it before any compute and
// `inspect` reports it. The header parser has already checked that every tensor's bytes lie in its file, so
// a truncated file is found here too.
#include <string>
#include <vector>

#include "io/model_folder.h"
#include "io/weight_index.h"
#include "models/clip/clip_config.h"
#include "models/flux/flux_config.h"
#include "models/scheduler/flow_match_config.h"
#include "models/t5/t5_config.h"
#include "models/vae/vae_config.h"

namespace dp::models {

// Throws at the first tensor of `expected` (each name after `prefix` and a dot, when given) that `weights`
// lacks, stores with another shape, or stores in a non-float dtype, naming the weight file, the tensor, both
// shapes and `config_path` (the file that implies the list); the message counts the other disagreements.
// Tensors beyond the list are allowed: the loaders ignore them, as transformers and diffusers do.
void check_weights_match(const io::WeightIndex& weights, const ParameterShapes& expected,
                         const std::string& config_path, const std::string& prefix = "");

// One component folder each: parses DIR/config.json and checks DIR's weights against it as the LibTorch
// loader of that class reads them. Throws naming the file and field, or the file and tensor; returns the
// parsed config.
ClipTextConfig check_clip_text_component(const std::string& dir);   // either checkpoint layout
T5Config check_t5_encoder_component(const std::string& dir);        // either name of the token embedding
FluxConfig check_flux_transformer_component(const std::string& dir);
VaeConfig check_vae_component(const std::string& dir, VaeParts parts);
// scheduler_config.json only: a scheduler has no weights.
schedulers::FlowMatchSchedulerConfig check_scheduler_component(const std::string& dir);

struct ComponentProblem {
  std::string component;  // as named in model_index.json
  std::string message;    // names the file and the field or tensor
};

// Everything a FluxPipeline run reads, the VAE only when it decodes: each component present with the class
// FluxPipeline runs, checked as above, and what the components must agree on (the transformer takes T5's
// hidden states, CLIP's pooled output and the VAE's latent channels, packed 2x2). Tokenizer folders are only
// required to exist here. Returns every problem found, in pipeline order; empty means ready to run.
std::vector<ComponentProblem> check_flux_pipeline(const io::ModelFolder& folder, bool decode);

// Every component of `folder`: its folder exists and its weight headers parse (so a component whose weights
// open is summarisable); those of the classes diffpipe runs (CLIPTextModel, T5EncoderModel,
// FluxTransformer2DModel, AutoencoderKL for decoding, FlowMatchEulerDiscreteScheduler) are checked as above,
// and in a FluxPipeline folder the agreements between those present. Components model_index.json does not
// list are not problems: a folder may hold only the encoders.
std::vector<ComponentProblem> check_model_folder(const io::ModelFolder& folder);

// Throws one dp::Error stating `problems` (each naming its file), when there are any.
void throw_if_problems(const std::vector<ComponentProblem>& problems, const std::string& folder_dir);

}  // namespace dp::models
