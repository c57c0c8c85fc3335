#include "models/lora_check.h"

#include <map>
#include <utility>

#include "core/error.h"

namespace dp::models {
namespace {

// module -> (out, in) for every Linear (a 2-D ".weight") among a model's parameters.
std::map<std::string, std::pair<int64_t, int64_t>> linears(const ParameterShapes& shapes, const char* skip_prefix) {
  std::map<std::string, std::pair<int64_t, int64_t>> out;
  for (const auto& p : shapes) {
    if (p.shape.size() != 2 || p.name.size() < 7 || p.name.compare(p.name.size() - 7, 7, ".weight") != 0) continue;
    if (skip_prefix != nullptr && p.name.rfind(skip_prefix, 0) == 0) continue;  // embeddings are not Linears
    out[p.name.substr(0, p.name.size() - 7)] = {p.shape[0], p.shape[1]};
  }
  return out;
}

std::string shape_text(int64_t a, int64_t b) { return str("[", a, ", ", b, "]"); }

}  // namespace

int64_t flux_module_block(const std::string& module, const FluxConfig& config) {
  for (const auto& [prefix, offset] : {std::pair<std::string, int64_t>{"transformer_blocks.", 0},
                                       std::pair<std::string, int64_t>{"single_transformer_blocks.", config.num_layers}}) {
    if (module.rfind(prefix, 0) != 0) continue;
    const size_t end = module.find('.', prefix.size());
    const std::string digits = module.substr(prefix.size(), end - prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
    return offset + std::stoll(digits);
  }
  return -1;
}

bool flux_module_is_embedder(const std::string& module) {
  return module.rfind("x_embedder", 0) == 0 || module.rfind("context_embedder", 0) == 0 ||
         module.rfind("time_text_embed.", 0) == 0;
}

void fit_lora_to_model(io::LoraFile& file, const FluxConfig& flux, const ClipTextConfig* clip) {
  const auto flux_linears = linears(flux_parameter_shapes(flux), nullptr);
  const auto clip_linears = clip ? linears(clip_text_parameter_shapes(*clip), "embeddings.")
                                 : std::map<std::string, std::pair<int64_t, int64_t>>{};
  const int64_t dim = flux.inner_dim();
  for (auto& m : file.modules) {
    const bool text = m.component == io::LoraComponent::text_encoder;
    DP_CHECK(!text || clip != nullptr, file.path, ": '", m.down_key, "' is a LoRA of the CLIP text encoder, but this ",
             "pipeline has no text_encoder component");
    const auto& table = text ? clip_linears : flux_linears;
    const auto found = table.find(m.module);
    DP_CHECK(found != table.end(), file.path, ": '", m.down_key, "' changes ", io::lora_component_name(m.component),
             " module '", m.module, "', which this model does not have as a Linear",
             text ? str(" (CLIP has ", clip->num_hidden_layers, " layers)")
                  : str(" (the transformer has ", flux.num_layers, " double and ", flux.num_single_layers,
                        " single blocks)"),
             "; is the adapter for another model?");
    const auto [out, in] = found->second;
    if (m.parts > 1) {
      // The fused projection's rows: [D, D, D] for qkv, [D, D, D, mlp] for linear1 (diffusers' dims).
      std::vector<int64_t> widths(3, dim);
      if (m.parts == 4) widths.push_back(flux.mlp_hidden_dim());
      DP_CHECK(static_cast<size_t>(m.parts) == widths.size(), file.path, ": '", m.down_key, "': a split into ", m.parts,
               " parts");
      int64_t total = 0;
      for (int64_t w : widths) total += w;
      DP_CHECK(m.up_rows == total, file.path, ": '", m.up_key, "' has ", m.up_rows, " rows, but the fused projection ",
               "it splits into ", m.parts, " modules has ", total, " (", m.parts == 4 ? "3 x " : "3 x ", dim,
               m.parts == 4 ? str(" + ", flux.mlp_hidden_dim()) : std::string(), ") for this model");
      m.row_offset = 0;
      for (int i = 0; i < m.part; ++i) m.row_offset += widths[static_cast<size_t>(i)];
      m.out_features = widths[static_cast<size_t>(m.part)];
    } else {
      m.row_offset = 0;
      m.out_features = m.up_rows;
    }
    DP_CHECK(m.out_features == out && m.in_features == in, file.path, ": '", m.down_key, "' / '", m.up_key,
             "' give module '", m.module, "' a ", shape_text(m.out_features, m.in_features), " update (rank ", m.rank,
             "), but its weight is ", shape_text(out, in), " in this model");
    m.block = text ? -1 : flux_module_block(m.module, flux);
  }
}

}  // namespace dp::models
