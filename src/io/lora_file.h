#pragma once
// LoRA adapter files for FLUX.1 (FluxPipeline.load_lora_weights' inputs), parsed without LibTorch from the
// safetensors header and the few scalar `alpha` values: which diffusers module each adapter changes, where
// its low-rank factors are in the file, and how diffusers 0.42.1 scales them. Three layouts:
//
//   diffusers/PEFT  transformer.<module>.lora_A.weight / .lora_B.weight [/ .alpha], optionally text_encoder.*
//                   keys for CLIP, optionally PEFT's config in __metadata__["lora_adapter_metadata"].
//   kohya           lora_unet_double_blocks_<i>_img_attn_qkv.lora_down.weight / .lora_up.weight / .alpha, and
//                   lora_te_*/lora_te1_* keys for CLIP.
//   BFL             the same with the original model's module names: diffusion_model.double_blocks.<i>.img_attn.
//                   qkv.lora_down.weight (ComfyUI's spelling), text_encoders.clip_l.transformer.* for CLIP.
//
// kohya and BFL files are converted as diffusers' _convert_kohya_flux_lora_to_diffusers converts them: a fused
// projection (img_attn_qkv, txt_attn_qkv, linear1) is split over the diffusers modules it feeds (to_q/to_k/to_v,
// plus proj_mlp for linear1) by rows of the up matrix, and alpha / rank is folded into the two factors as powers
// of two (scale_down, scale_up) in the file's dtype. Where diffusers drops keys (the embedders and final layer of a
// kohya file, T5 and position-embedding keys) they are listed as ignored, not applied, so results stay diffusers'.
//
// Every check that needs no model happens here: layout, key grammar, A/B pairs, 2-D floating factors whose
// ranks agree, finite scalar alphas. models/lora_check.h then fits the modules to a model's config (the module
// exists and is a Linear of matching shape), and check_lora_finite reads the factors of the modules a rank
// will load. Errors name the file and the key.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"

namespace dp::io {

enum class LoraLayout { diffusers, kohya, bfl };
// "diffusers/PEFT", "kohya", "BFL"
const char* lora_layout_name(LoraLayout layout);

enum class LoraComponent { transformer, text_encoder };
const char* lora_component_name(LoraComponent component);  // "transformer", "text_encoder"

// PEFT's lora_alpha of one module: scaling = user scale * alpha / rank (or / sqrt(rank) with rsLoRA), computed
// as PEFT computes it. An alpha read from the file is a tensor, and PEFT then does that arithmetic in the
// tensor's dtype; an alpha from metadata or the rank itself is a Python number (double arithmetic).
struct LoraAlpha {
  double value = 0;
  std::optional<DType> tensor_dtype;  // set when the arithmetic rounds to this dtype
  bool equals_rank = false;           // no alpha anywhere: alpha is the module's rank (scaling 1)
  bool rslora = false;
};

// One diffusers module an adapter changes, with where its factors are in the file.
struct LoraModule {
  LoraComponent component = LoraComponent::transformer;
  // diffusers/PEFT module path inside its component: "transformer_blocks.3.attn.to_q",
  // "single_transformer_blocks.0.proj_mlp", "encoder.layers.0.self_attn.q_proj" (CLIP, without "text_model.").
  std::string module;
  std::string down_key, up_key;  // lora_A / lora_down and lora_B / lora_up tensors
  int64_t rank = 0;              // rows of the down tensor
  int64_t in_features = 0;       // its columns
  int64_t up_rows = 0;           // rows of the up tensor (of the fused projection for a split)
  // A kohya/BFL fused projection feeds `parts` diffusers modules; this is part `part`. Its rows of the up
  // tensor are [row_offset, row_offset + out_features) (filled in by models::fit_lora_to_model, which knows the
  // model's widths). When the up tensor is block-diagonal diffusers also gives each part only its slice of the
  // rank; that is decided on the values, when the block's factors load.
  int part = 0;
  int parts = 1;
  int64_t row_offset = 0;
  int64_t out_features = 0;
  // kohya/BFL: alpha / rank folded into the factors in the file's dtype (down *= down_multiplier,
  // up *= up_multiplier); 1 for the diffusers layout.
  double down_multiplier = 1.0;
  double up_multiplier = 1.0;
  LoraAlpha alpha;
  DType dtype = DType::F32;  // of the down tensor (the up tensor's may differ)
  // The global block index (double blocks first, as FluxTransformer numbers them) for transformer blocks; -1
  // for the embedders, the output head and the text encoder. Filled in by models::fit_lora_to_model.
  int64_t block = -1;
};

struct LoraFile {
  std::string path;
  LoraLayout layout = LoraLayout::diffusers;
  std::vector<LoraModule> modules;  // in file key order
  // Keys diffusers reads but does not apply (with why), e.g. a kohya file's img_in: warned about, not applied.
  std::vector<std::string> ignored;
  bool has_component(LoraComponent component) const;
  // Ranks as the file stores them (the smallest and largest over modules).
  int64_t min_rank() const;
  int64_t max_rank() const;
};

// PEFT's `scale * lora_alpha / r` (or / sqrt(r) with rsLoRA) for a module of rank `rank`: the factor its LoRA
// output B A x is multiplied by, with the arithmetic in the alpha tensor's dtype where the alpha is one.
double lora_scaling(const LoraAlpha& alpha, int64_t rank, double user_scale);

// Parses a LoRA file's header (and its scalar alphas, read through `read_bytes`). `source` names the file in
// errors. Throws dp::Error naming the file and the key for anything diffusers would refuse or misread.
using TensorBytes = std::function<const std::byte*(const TensorInfo&)>;
LoraFile parse_lora(const SafetensorsHeader& header, const TensorBytes& read_bytes, const std::string& source);
// A whole file image in memory (fuzzing, tests).
LoraFile parse_lora_image(std::string_view image, const std::string& source);
// Maps the file, parses it and keeps nothing mapped.
LoraFile read_lora_file(const std::string& path);

// Reads the factors of `modules` (all when empty) and throws naming the file and the first key holding a NaN
// or an infinity. `file` must be the mapped file the modules came from.
void check_lora_finite(const SafetensorsFile& file, const std::vector<const LoraModule*>& modules);

// What the user asked for: --lora [NAME=]FILE[:SCALE] or a run config's {"path", "scale", "name"}.
struct LoraSpec {
  std::string name;  // default: the file name without .safetensors
  std::string path;
  double scale = 1.0;
};
// At most this many adapters in one run: a list longer than any real use is refused before any file opens.
inline constexpr size_t kMaxLoraAdapters = 64;
// Parses one --lora word; throws naming it.
LoraSpec parse_lora_spec(const std::string& word);
// Checks a run's list: count, unique names of [A-Za-z0-9_-] (what prompt tags can name), finite scales.
void check_lora_specs(const std::vector<LoraSpec>& specs);

// A digest of an adapter file as the run uses it (its header, alphas and the name and scale asked for): ranks
// and checkpoints compare these. Torch-free and cheap (no factor is read).
std::string lora_fingerprint(const LoraFile& file, const LoraSpec& spec);

// PEFT's get_pattern_key match, `(.*\.)?(pattern)$` on a module name, for the literal patterns PEFT and
// diffusers write (module names, optionally starting with ^; a '.' matches any character as in the regex).
bool lora_pattern_matches(std::string_view pattern, std::string_view module);

}  // namespace dp::io
