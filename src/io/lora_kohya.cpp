// The kohya layout (lora_unet_double_blocks_3_img_attn_qkv.lora_down.weight) and the BFL one ComfyUI writes
// (diffusion_model.double_blocks.3.img_attn.qkv.lora_down.weight), converted to diffusers modules exactly as
// diffusers 0.42.1's _convert_kohya_flux_lora_to_diffusers does:
//   1. BFL names become kohya ones: "diffusion_model." -> "lora_unet_", "text_encoders.clip_l.transformer." ->
//      "lora_te_", and the dots before lora_down/lora_up/alpha become underscores;
//   2. keys diffusers filters out are listed as ignored (T5, position embeddings, diff/diff_b, text_projection,
//      and keys outside lora_unet_/lora_te_/lora_te1_);
//   3. each module's alpha / rank is folded into its factors (fold_alpha); a missing alpha means alpha = rank;
//   4. img_attn_qkv / txt_attn_qkv split into three equal row blocks (to_q, to_k, to_v / add_*_proj), linear1
//      into to_q, to_k, to_v and proj_mlp (diffusers hard-codes FLUX.1's [3072, 3072, 3072, 12288]; the widths
//      come from the model's config here, the same numbers for FLUX.1);
//   5. the embedders and the final layer (img_in, txt_in, time_in, vector_in, guidance_in, final_layer) are
//      converted by diffusers to keys without the "transformer." prefix, which load_lora_weights then never
//      loads: they are listed as ignored, so the result stays diffusers'.
// PEFT then sees no alphas, so every converted module has lora_alpha = rank (scale 1 besides the folded one).
#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "core/error.h"
#include "io/lora_layouts.h"

namespace dp::io::lora_detail {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

// diffusers' _custom_replace: dots become underscores up to the first of `limits` (and the dot before it).
std::string custom_replace(const std::string& key, const std::vector<std::string>& limits) {
  size_t first = std::string::npos;
  for (const auto& l : limits) first = std::min(first, key.find(l));
  if (first == std::string::npos) {
    std::string all = key;
    replace_all(all, ".", "_");
    return all;
  }
  const size_t boundary = first > 0 && key[first - 1] == '.' ? first - 1 : first;
  std::string left = key.substr(0, boundary);
  replace_all(left, ".", "_");
  return left + key.substr(boundary);
}

struct Target {
  const char* kohya;
  std::vector<const char*> modules;  // several: a fused projection split by rows
};

const std::vector<Target>& double_block_targets() {
  static const std::vector<Target> targets = {
      {"img_attn_proj", {"attn.to_out.0"}},
      {"img_attn_qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
      {"img_mlp_0", {"ff.net.0.proj"}},
      {"img_mlp_2", {"ff.net.2"}},
      {"img_mod_lin", {"norm1.linear"}},
      {"txt_attn_proj", {"attn.to_add_out"}},
      {"txt_attn_qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
      {"txt_mlp_0", {"ff_context.net.0.proj"}},
      {"txt_mlp_2", {"ff_context.net.2"}},
      {"txt_mod_lin", {"norm1_context.linear"}},
  };
  return targets;
}

const std::vector<Target>& single_block_targets() {
  static const std::vector<Target> targets = {
      {"linear1", {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}},
      {"linear2", {"proj_out"}},
      {"modulation_lin", {"norm.linear"}},
  };
  return targets;
}

// Converted by diffusers to keys outside "transformer.", so never loaded.
const std::set<std::string>& dropped_unet_modules() {
  static const std::set<std::string> names = {
      "lora_unet_guidance_in_in_layer", "lora_unet_guidance_in_out_layer", "lora_unet_img_in", "lora_unet_txt_in",
      "lora_unet_time_in_in_layer",     "lora_unet_time_in_out_layer",     "lora_unet_vector_in_in_layer",
      "lora_unet_vector_in_out_layer",  "lora_unet_final_layer_adaLN_modulation_1", "lora_unet_final_layer_linear"};
  return names;
}

// "lora_unet_double_blocks_12_img_attn_qkv" -> block 12, target img_attn_qkv.
bool parse_block(const std::string& name, const std::string& prefix, int64_t* block, std::string* rest) {
  if (!starts_with(name, prefix)) return false;
  size_t i = prefix.size();
  const size_t digits = i;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  // Python's f"{i}" writes no leading zeros and no sign; anything else is not a key diffusers produces.
  if (i == digits || i - digits > 6 || (name[digits] == '0' && i - digits > 1) || i >= name.size() || name[i] != '_')
    return false;
  *block = std::stoll(name.substr(digits, i - digits));
  *rest = name.substr(i + 1);
  return true;
}

// CLIP's modules as kohya names them: text_model_encoder_layers_<i>_self_attn_q_proj, ..._mlp_fc1.
bool parse_text_encoder(const std::string& name, std::string* module) {
  std::string rest;
  if (starts_with(name, "lora_te_")) rest = name.substr(8);
  else if (starts_with(name, "lora_te1_")) rest = name.substr(9);
  else return false;
  int64_t layer = 0;
  std::string tail;
  if (!parse_block(rest, "text_model_encoder_layers_", &layer, &tail)) return false;
  static const std::map<std::string, std::string> tails = {
      {"self_attn_q_proj", "self_attn.q_proj"}, {"self_attn_k_proj", "self_attn.k_proj"},
      {"self_attn_v_proj", "self_attn.v_proj"}, {"self_attn_out_proj", "self_attn.out_proj"},
      {"mlp_fc1", "mlp.fc1"},                   {"mlp_fc2", "mlp.fc2"}};
  const auto found = tails.find(tail);
  if (found == tails.end()) return false;
  *module = "encoder.layers." + std::to_string(layer) + "." + found->second;
  return true;
}

enum class Role { down, up, alpha };

struct Group {
  std::string name;  // the kohya module name, before ".lora_down.weight"
  const TensorInfo* down = nullptr;
  const TensorInfo* up = nullptr;
  const TensorInfo* alpha = nullptr;
};

}  // namespace

void parse_kohya_layout(const LoraKeys& keys, LoraFile& out) {
  bool bfl = false;
  bool has_alpha = false;
  for (const TensorInfo* t : keys.tensors) {
    if (t->name.find("diffusion_model.") != std::string::npos) bfl = true;
    if (t->name.find("alpha") != std::string::npos) has_alpha = true;
  }
  out.layout = bfl ? LoraLayout::bfl : LoraLayout::kohya;
  for (const TensorInfo* t : keys.tensors) {
    if (starts_with(t->name, "transformer."))
      DP_FAIL(keys.source, ": '", t->name, "': diffusers module names with kohya's lora_down/lora_up factors; ",
              "this mixed layout is not supported (rename the factors lora_A/lora_B)");
    if (starts_with(t->name, "lora_transformer_"))
      DP_FAIL(keys.source, ": '", t->name, "': the lora_transformer_* mixture layout is not supported");
  }
  const bool norm_diff = std::any_of(keys.tensors.begin(), keys.tensors.end(), [](const TensorInfo* t) {
    return t->name.find(".norm") != std::string::npos && t->name.find(".diff") != std::string::npos;
  });
  std::vector<std::string> limits = {"lora_down", "lora_up"};
  if (has_alpha) limits.push_back("alpha");

  std::map<std::string, Group> groups;
  std::vector<std::string> order;
  std::map<std::string, size_t> dropped;  // reason -> count
  for (const TensorInfo* t : keys.tensors) {
    std::string k = t->name;
    replace_all(k, "diffusion_model.", "lora_unet_");
    replace_all(k, "text_encoders.clip_l.transformer.", "lora_te_");
    if (k.find("position_embedding") != std::string::npos) { ++dropped["position_embedding (not supported by diffusers)"]; continue; }
    if (starts_with(k, "text_encoders.t5xxl.transformer.")) { ++dropped["T5 (text_encoders.t5xxl)"]; continue; }
    const bool unet_or_te = starts_with(k, "lora_unet_") || starts_with(k, "lora_te_") || starts_with(k, "lora_te1_");
    if (unet_or_te && k.find("diff_b") != std::string::npos) { ++dropped["diff_b"]; continue; }
    if (norm_diff && (k.find(".norm") != std::string::npos || k.find(".diff") != std::string::npos)) {
      ++dropped["normalization diff"];
      continue;
    }
    if (!unet_or_te) { ++dropped["outside lora_unet_/lora_te_/lora_te1_ (e.g. " + t->name + ")"]; continue; }
    k = custom_replace(k, limits);
    if (k.find("text_projection") != std::string::npos) { ++dropped["text_projection"]; continue; }
    std::string group_name;
    Role role = Role::alpha;
    if (ends_with(k, ".lora_down.weight")) {
      group_name = k.substr(0, k.size() - 17);
      role = Role::down;
    } else if (ends_with(k, ".lora_up.weight")) {
      group_name = k.substr(0, k.size() - 15);
      role = Role::up;
    } else if (ends_with(k, ".alpha")) {
      group_name = k.substr(0, k.size() - 6);
    } else {
      DP_FAIL(keys.source, ": '", t->name, "' is neither a lora_down, a lora_up nor an alpha (LyCORIS/LoHa/LoKr ",
              "factors are not supported)");
    }
    auto [it, inserted] = groups.try_emplace(group_name);
    if (inserted) {
      it->second.name = group_name;
      order.push_back(group_name);
    }
    Group& g = it->second;
    const TensorInfo*& target = role == Role::down ? g.down : (role == Role::up ? g.up : g.alpha);
    DP_CHECK(target == nullptr, keys.source, ": '", t->name, "' and '", target ? target->name : "", "' both become '", k,
             "' once BFL names are converted to kohya ones");
    target = t;
  }
  for (const auto& [reason, count] : dropped) out.ignored.push_back(str(count, " key(s): ", reason));

  for (const auto& name : order) {
    const Group& g = groups.at(name);
    if (dropped_unet_modules().count(name) != 0) {
      out.ignored.push_back(name + ": diffusers 0.42.1 converts kohya embedder/final-layer LoRAs to keys without the "
                                   "\"transformer.\" prefix and never loads them");
      continue;
    }
    const TensorInfo* any = g.down ? g.down : (g.up ? g.up : g.alpha);
    DP_CHECK(g.down != nullptr, keys.source, ": '", any->name, "' has no matching lora_down factor (", name,
             ".lora_down.weight)");
    DP_CHECK(g.up != nullptr, keys.source, ": '", g.down->name, "' has no matching lora_up factor (", name,
             ".lora_up.weight)");
    LoraModule base;
    base.down_key = g.down->name;
    base.up_key = g.up->name;
    read_factor_shapes(keys, *g.down, *g.up, base);
    base.alpha.equals_rank = true;
    // diffusers' folding loop never ends for an alpha below zero (it doubles scale_down towards -inf).
    if (g.alpha != nullptr)
      DP_CHECK(scalar_value(keys, *g.alpha) > 0, keys.source, ": '", g.alpha->name, "' is ", scalar_value(keys, *g.alpha),
               "; a kohya alpha must be positive");

    std::string module;
    std::vector<const char*> targets;
    int64_t block = 0;
    std::string rest;
    if (parse_block(name, "lora_unet_double_blocks_", &block, &rest)) {
      for (const auto& t : double_block_targets())
        if (rest == t.kohya) targets = t.modules;
      module = "transformer_blocks." + std::to_string(block) + ".";
    } else if (parse_block(name, "lora_unet_single_blocks_", &block, &rest)) {
      for (const auto& t : single_block_targets())
        if (rest == t.kohya) targets = t.modules;
      module = "single_transformer_blocks." + std::to_string(block) + ".";
    } else if (std::string te; parse_text_encoder(name, &te)) {
      base.component = LoraComponent::text_encoder;
      base.module = te;
      // diffusers folds a text encoder's alpha with .item(): Python float arithmetic.
      if (g.alpha != nullptr) fold_alpha(scalar_value(keys, *g.alpha), base.rank, DType::F64, base.down_multiplier,
                                         base.up_multiplier);
      base.out_features = base.up_rows;
      out.modules.push_back(base);
      continue;
    }
    DP_CHECK(!targets.empty(), keys.source, ": '", g.down->name, "' (", name, ") names no module of FLUX.1's ",
             "transformer or CLIP text encoder; is it an adapter for another model (SD 1.x/SDXL kohya keys look ",
             "alike)?");
    const bool split = targets.size() > 1;
    // diffusers' single-module path reads alpha with .item() (a Python float); the split path keeps it a tensor
    // and a missing alpha becomes tensor(rank) in the factor's dtype.
    const DType arithmetic = split ? (g.alpha ? g.alpha->dtype : g.down->dtype) : DType::F64;
    const double alpha = g.alpha ? scalar_value(keys, *g.alpha)
                                 : (split ? round_to(g.down->dtype, static_cast<double>(base.rank))
                                          : static_cast<double>(base.rank));
    fold_alpha(alpha, base.rank, arithmetic, base.down_multiplier, base.up_multiplier);
    for (size_t i = 0; i < targets.size(); ++i) {
      LoraModule m = base;
      m.module = module + targets[i];
      m.part = static_cast<int>(i);
      m.parts = static_cast<int>(targets.size());
      out.modules.push_back(m);
    }
  }
}

}  // namespace dp::io::lora_detail
