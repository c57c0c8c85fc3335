// The diffusers/PEFT layout: transformer.<module>.lora_A.weight / .lora_B.weight, text_encoder.<module>...,
// and either `.alpha` keys or PEFT's LoraConfig in the header's metadata. How diffusers 0.42.1 + PEFT turn
// the alphas into each module's lora_alpha (get_peft_kwargs, LoraModel._create_and_replace):
//   * no alpha at all: lora_alpha = rank for every module (scale 1);
//   * alpha keys: they are tensors, each its own Counter entry, so the "most common" alpha is the first one in
//     key order; every alpha whose value differs from it goes to alpha_pattern under its module name; a module
//     takes the value of the first alpha_pattern key matching it as a dotted suffix (PEFT's get_pattern_key),
//     else the first alpha, even when the file gives it no alpha of its own. The arithmetic
//     `scale * lora_alpha / r` then happens in that tensor's dtype;
//   * metadata (lora_adapter_metadata): r, lora_alpha, rank_pattern, alpha_pattern, use_rslora as written.
// For the text encoder, transformers 5's CLIPTextModel has no `text_model.` level: diffusers strips it from the
// factor keys but not from the alpha keys, so such alpha patterns match no module (the first alpha applies).
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "io/lora_layouts.h"

namespace dp::io::lora_detail {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

std::string strip_text_model(const std::string& module) {
  return starts_with(module, "text_model.") ? module.substr(11) : module;
}

struct Pending {
  LoraComponent component = LoraComponent::transformer;
  std::string module;
  const TensorInfo* down = nullptr;
  const TensorInfo* up = nullptr;
};

struct AlphaKey {
  std::string pattern;  // the module name as diffusers puts it in alpha_pattern
  double value = 0;
  DType dtype = DType::F32;
};

// PEFT's LoraConfig fields diffusers wrote into the file, for one component.
struct MetadataConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  bool rslora = false;
  std::vector<std::pair<std::string, double>> rank_pattern, alpha_pattern;
};

std::vector<std::pair<std::string, double>> pattern_of(const nlohmann::ordered_json& value, const std::string& where) {
  DP_CHECK(value.is_object(), where, " must be an object");
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [key, number] : value.items()) {
    DP_CHECK(number.is_number() && std::isfinite(number.get<double>()), where, "['", key, "'] must be a finite number");
    DP_CHECK(!key.empty() && key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.^") ==
                                 std::string::npos,
             where, ": pattern '", key, "' is not a module name (only module names, optionally starting with ^, are read)");
    out.emplace_back(key, number.get<double>());
  }
  return out;
}

std::optional<MetadataConfig> metadata_config(const LoraKeys& keys, LoraComponent component, bool* any_metadata) {
  const auto found = keys.header->metadata.find("lora_adapter_metadata");
  if (found == keys.header->metadata.end()) return std::nullopt;
  *any_metadata = true;
  const std::string where = keys.source + ": __metadata__ lora_adapter_metadata";
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(found->second, nullptr, true, false);
  } catch (const std::exception& e) {
    DP_FAIL(where, " is not JSON: ", e.what());
  }
  DP_CHECK(doc.is_object(), where, " must be a JSON object");
  const std::string prefix = std::string(lora_component_name(component)) + ".";
  MetadataConfig config;
  bool any = false;
  for (const auto& [key, value] : doc.items()) {
    if (!starts_with(key, prefix)) continue;
    any = true;
    const std::string field = key.substr(prefix.size());
    const std::string at = where + " '" + key + "'";
    if (field == "r") {
      DP_CHECK(value.is_number_integer() && value.get<int64_t>() >= 1, at, " must be a positive integer");
      config.r = value.get<int64_t>();
    } else if (field == "lora_alpha") {
      DP_CHECK(value.is_number() && std::isfinite(value.get<double>()), at, " must be a finite number");
      config.lora_alpha = value.get<double>();
    } else if (field == "use_rslora") {
      config.rslora = value.is_boolean() && value.get<bool>();
    } else if (field == "use_dora") {
      DP_CHECK(!(value.is_boolean() && value.get<bool>()), at, ": DoRA adapters are not supported");
    } else if (field == "lora_bias") {
      DP_CHECK(!(value.is_boolean() && value.get<bool>()), at, ": LoRA biases (lora_bias) are not supported");
    } else if (field == "rank_pattern") {
      config.rank_pattern = pattern_of(value, at);
    } else if (field == "alpha_pattern") {
      config.alpha_pattern = pattern_of(value, at);
    }
  }
  if (!any) return std::nullopt;
  return config;
}

template <typename Pattern>
const Pattern* first_match(const std::vector<Pattern>& patterns, const std::string& module,
                           const std::string& (*key_of)(const Pattern&)) {
  for (const auto& p : patterns)
    if (lora_pattern_matches(key_of(p), module)) return &p;
  return nullptr;
}

const std::string& pair_key(const std::pair<std::string, double>& p) { return p.first; }
const std::string& alpha_key(const AlphaKey& a) { return a.pattern; }

[[noreturn]] void unsupported_key(const LoraKeys& keys, const std::string& name) {
  if (starts_with(name, "diffusion_model.") || starts_with(name, "double_blocks.") || starts_with(name, "single_blocks."))
    DP_FAIL(keys.source, ": '", name, "': BFL module names with lora_A/lora_B factors; diffusers 0.42.1 loads no ",
            "weights from such a file for FLUX.1 (it reads BFL names only with lora_down/lora_up, as ComfyUI writes them)");
  if (name.find("processor") != std::string::npos)
    DP_FAIL(keys.source, ": '", name, "': an XLabs LoRA (processor keys); this layout is not supported");
  if (name.find("query_norm.scale") != std::string::npos)
    DP_FAIL(keys.source, ": '", name, "': a FLUX Control LoRA (it widens x_embedder); not supported");
  if (name.find("base_model") != std::string::npos)
    DP_FAIL(keys.source, ": '", name, "': a raw PEFT adapter (base_model.model.*); save it with diffusers' ",
            "save_lora_weights (transformer.* keys) to use it");
  DP_FAIL(keys.source, ": '", name, "' names no module of FluxPipeline's transformer or text_encoder (expected ",
          "transformer.<module>.lora_A.weight / .lora_B.weight / .alpha, text_encoder.<module>..., or a kohya / BFL ",
          "file with lora_down/lora_up); is it an adapter for another model?");
}

}  // namespace

void parse_diffusers_layout(const LoraKeys& keys, LoraFile& out) {
  out.layout = LoraLayout::diffusers;
  std::map<std::pair<LoraComponent, std::string>, Pending> pending;
  std::vector<std::pair<LoraComponent, std::string>> order;
  std::map<LoraComponent, std::vector<AlphaKey>> alphas;
  for (const TensorInfo* t : keys.tensors) {
    const std::string& name = t->name;
    LoraComponent component;
    std::string rest;
    if (starts_with(name, "transformer.")) {
      component = LoraComponent::transformer;
      rest = name.substr(12);
    } else if (starts_with(name, "text_encoder.")) {
      component = LoraComponent::text_encoder;
      rest = name.substr(13);
    } else {
      unsupported_key(keys, name);
    }
    if (ends_with(rest, ".alpha")) {
      const std::string module = rest.substr(0, rest.size() - 6);
      alphas[component].push_back({module, scalar_value(keys, *t), t->dtype});
      continue;
    }
    std::string module;
    bool down = false;
    if (ends_with(rest, ".lora_A.weight")) {
      module = rest.substr(0, rest.size() - 14);
      down = true;
    } else if (ends_with(rest, ".lora_B.weight")) {
      module = rest.substr(0, rest.size() - 14);
    } else if (ends_with(rest, ".lora_B.bias")) {
      DP_FAIL(keys.source, ": '", name, "': LoRA biases (PEFT lora_bias) are not supported");
    } else if (rest.find("lora_magnitude_vector") != std::string::npos) {
      DP_FAIL(keys.source, ": '", name, "': DoRA adapters are not supported");
    } else if (rest.find("lora_linear_layer") != std::string::npos || rest.find(".lora.") != std::string::npos) {
      DP_FAIL(keys.source, ": '", name, "': the old diffusers LoRA naming (lora.down / lora_linear_layer); ",
              "re-save the adapter with a current diffusers");
    } else if (component == LoraComponent::transformer &&
               (rest.find("norm_q.") != std::string::npos || rest.find("norm_k.") != std::string::npos ||
                rest.find("norm_added_q.") != std::string::npos || rest.find("norm_added_k.") != std::string::npos)) {
      DP_FAIL(keys.source, ": '", name, "': normalization weights of a FLUX Control LoRA; not supported");
    } else {
      unsupported_key(keys, name);
    }
    if (component == LoraComponent::text_encoder) module = strip_text_model(module);
    DP_CHECK(!module.empty(), keys.source, ": '", name, "' names no module");
    const auto key = std::make_pair(component, module);
    auto [it, inserted] = pending.try_emplace(key);
    if (inserted) {
      order.push_back(key);
      it->second.component = component;
      it->second.module = module;
    }
    const TensorInfo*& slot = down ? it->second.down : it->second.up;
    DP_CHECK(slot == nullptr, keys.source, ": two keys hold the ", down ? "lora_A" : "lora_B", " factor of '", module,
             "' ('", slot ? slot->name : "", "' and '", name, "')");
    slot = t;
  }

  bool any_metadata = false;
  std::map<LoraComponent, std::optional<MetadataConfig>> configs;
  for (LoraComponent c : {LoraComponent::transformer, LoraComponent::text_encoder})
    configs[c] = metadata_config(keys, c, &any_metadata);
  const bool any_alpha = !alphas[LoraComponent::transformer].empty() || !alphas[LoraComponent::text_encoder].empty();
  DP_CHECK(!(any_metadata && any_alpha), keys.source, ": holds both alpha keys and lora_adapter_metadata; diffusers ",
           "refuses such a file (\"network_alphas and metadata cannot be specified both\")");

  for (const auto& key : order) {
    const Pending& p = pending.at(key);
    const std::string component = lora_component_name(p.component);
    DP_CHECK(p.down != nullptr, keys.source, ": '", p.up->name, "' has no matching lora_A factor ('", component, ".",
             p.module, ".lora_A.weight')");
    DP_CHECK(p.up != nullptr, keys.source, ": '", p.down->name, "' has no matching lora_B factor ('", component, ".",
             p.module, ".lora_B.weight')");
    LoraModule m;
    m.component = p.component;
    m.module = p.module;
    m.down_key = p.down->name;
    m.up_key = p.up->name;
    read_factor_shapes(keys, *p.down, *p.up, m);
    m.out_features = m.up_rows;
    const auto& config = configs[p.component];
    if (config) {
      const auto* r = first_match(config->rank_pattern, m.module, pair_key);
      const int64_t rank = r ? static_cast<int64_t>(r->second) : config->r;
      DP_CHECK(rank == m.rank, keys.source, ": '", m.down_key, "' has rank ", m.rank, " but the file's LoRA config says ",
               rank, " for '", m.module, "'");
      const auto* a = first_match(config->alpha_pattern, m.module, pair_key);
      m.alpha.value = a ? a->second : config->lora_alpha;
      m.alpha.rslora = config->rslora;
    } else if (alphas[p.component].empty()) {
      m.alpha.equals_rank = true;
      m.alpha.value = static_cast<double>(m.rank);
    } else {
      const auto& list = alphas[p.component];
      const AlphaKey& first = list.front();
      std::vector<AlphaKey> differing;
      for (const auto& a : list)
        if (a.value != first.value) differing.push_back(a);
      const AlphaKey* match = first_match(differing, m.module, alpha_key);
      const AlphaKey& chosen = match ? *match : first;
      m.alpha.value = chosen.value;
      m.alpha.tensor_dtype = chosen.dtype;
    }
    out.modules.push_back(std::move(m));
  }
  for (const auto& [component, list] : alphas)
    for (const auto& a : list) {
      const std::string module = component == LoraComponent::text_encoder ? strip_text_model(a.pattern) : a.pattern;
      DP_CHECK(pending.count({component, module}) != 0, keys.source, ": '", lora_component_name(component), ".",
               a.pattern, ".alpha' belongs to no LoRA factor pair in the file");
    }
}

}  // namespace dp::io::lora_detail
