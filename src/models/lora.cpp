#include "models/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "io/torch_tensors.h"
#include "models/module_weights.h"

namespace dp::models {

const char* lora_mode_name(LoraMode mode) { return mode == LoraMode::fused ? "fused" : "unfused"; }

LoraMode parse_lora_mode(const std::string& name) {
  if (name == "fused") return LoraMode::fused;
  if (name == "unfused") return LoraMode::unfused;
  DP_FAIL("--lora-mode: expected fused or unfused, got '", name, "'");
}

void AdapterRows::set_uniform(AdapterWeights weights) {
  rows_ = {std::move(weights)};
  per_row_ = false;
}

void AdapterRows::set_rows(std::vector<AdapterWeights> rows) {
  DP_CHECK(!rows.empty(), "adapter weights for an empty batch");
  const bool same = std::all_of(rows.begin(), rows.end(), [&](const AdapterWeights& r) { return r == rows.front(); });
  if (same) {
    set_uniform(rows.front());
    return;
  }
  rows_ = std::move(rows);
  per_row_ = true;
}

void LowRankAdapters::add_to(at::Tensor& y, const at::Tensor& x) const {
  const int64_t batch = x.dim() >= 2 ? x.size(0) : 1;
  DP_CHECK(rows_->uniform() || static_cast<int64_t>(rows_->rows()) == batch, "adapter weights are set for ",
           rows_->rows(), " rows but the batch has ", batch);
  for (const auto& f : factors_) {
    at::Tensor delta;
    if (rows_->uniform()) {
      const double weight = rows_->row(0)[f.adapter];
      if (weight == 0) continue;
      // PEFT: lora_B(lora_A(x)) * scaling, a Python number (or 0-dim tensor) times the run-dtype output.
      delta = at::linear(at::linear(x, f.down), f.up) * io::lora_scaling(f.alpha, f.rank, weight);
    } else {
      std::vector<float> scalings(static_cast<size_t>(batch));
      bool any = false;
      for (int64_t r = 0; r < batch; ++r) {
        const double weight = rows_->row(static_cast<size_t>(r))[f.adapter];
        scalings[static_cast<size_t>(r)] = weight == 0 ? 0.0f : static_cast<float>(io::lora_scaling(f.alpha, f.rank, weight));
        any = any || weight != 0;
      }
      if (!any) continue;
      const at::Tensor low_rank = at::linear(at::linear(x, f.down), f.up);
      std::vector<int64_t> shape(static_cast<size_t>(low_rank.dim()), 1);
      shape[0] = batch;
      // The float product rounded once, as a scalar multiply of the run dtype computes it.
      const at::Tensor per_row = at::tensor(scalings).to(low_rank.device()).view(shape);
      delta = (low_rank.to(at::kFloat) * per_row).to(low_rank.scalar_type());
    }
    if (f.row_offset == 0 && delta.size(-1) == y.size(-1)) y.add_(delta);
    else y.narrow(-1, f.row_offset, delta.size(-1)).add_(delta);
  }
}

std::shared_ptr<const LowRankAdapters> LowRankAdapters::map(const std::function<at::Tensor(const at::Tensor&)>& f) const {
  std::vector<LowRankFactors> mapped = factors_;
  for (auto& m : mapped) {
    m.down = f(m.down);
    m.up = f(m.up);
  }
  return std::make_shared<const LowRankAdapters>(std::move(mapped), rows_);
}

std::shared_ptr<const LowRankAdapters> LowRankAdapters::concat(const std::vector<const Linear*>& parts) {
  std::vector<LowRankFactors> all;
  std::shared_ptr<const AdapterRows> rows;
  int64_t offset = 0;
  for (const Linear* part : parts) {
    if (part->adapters) {
      for (auto f : part->adapters->factors_) {
        f.row_offset += offset;
        all.push_back(std::move(f));
      }
      rows = part->adapters->rows_;
    }
    offset += part->weight.size(0);
  }
  if (all.empty()) return nullptr;
  return std::make_shared<const LowRankAdapters>(std::move(all), rows);
}

uint64_t LowRankAdapters::nbytes() const {
  uint64_t bytes = 0;
  for (const auto& f : factors_) bytes += f.down.nbytes() + f.up.nbytes();
  return bytes;
}

LoraSet::LoraSet(std::vector<LoraAdapter> adapters, LoraMode mode, std::vector<AdapterWeights> selections)
    : adapters_(std::move(adapters)), mode_(mode), selections_(std::move(selections)) {
  DP_CHECK(!selections_.empty(), "a LoRA set needs its default adapter weights");
  for (const auto& s : selections_)
    DP_CHECK(s.size() == adapters_.size(), "adapter weights for ", s.size(), " adapters, but ", adapters_.size(),
             " are loaded");
  DP_CHECK(mode_ == LoraMode::unfused || selections_.size() == 1,
           "choosing adapters per prompt needs --lora-mode unfused (fused mode merges one choice into the weights)");
  for (size_t a = 0; a < adapters_.size(); ++a) {
    files_.push_back(io::SafetensorsFile::open(adapters_[a].file.path));
    for (const auto& m : adapters_[a].file.modules) {
      index_[{m.component, m.module}].push_back({a, &m});
      for (const auto& s : selections_) {
        const double scaling = io::lora_scaling(m.alpha, m.rank, s[a]);
        DP_CHECK(std::isfinite(scaling), adapters_[a].file.path, ": '", m.down_key, "': scale ", s[a], " x alpha ",
                 m.alpha.value, " / rank ", m.rank, " is not finite in the alpha's dtype");
      }
    }
  }
}

bool LoraSet::touches(io::LoraComponent component) const {
  return std::any_of(adapters_.begin(), adapters_.end(),
                     [&](const LoraAdapter& a) { return a.file.has_component(component); });
}

bool LoraSet::touches(io::LoraComponent component, const std::string& module) const {
  return index_.count({component, module}) != 0;
}

void LoraSet::check_finite(io::LoraComponent component, const std::function<bool(const io::LoraModule&)>& holds) const {
  for (size_t a = 0; a < adapters_.size(); ++a) {
    std::vector<const io::LoraModule*> modules;
    for (const auto& m : adapters_[a].file.modules)
      if (m.component == component && holds(m)) modules.push_back(&m);
    io::check_lora_finite(*files_[a], modules);
  }
}

// diffusers splits a kohya/BFL fused projection by its rank too when the up factor is block-diagonal (zero
// outside each part's rows x rank-slice): `is_sparse` in _convert_to_ai_toolkit_cat. Decided once per factor.
bool LoraSet::block_diagonal(size_t adapter, const io::LoraModule& m) const {
  if (m.parts <= 1 || m.rank % m.parts != 0) return false;
  const std::lock_guard<std::mutex> lock(sparse_mutex_);
  const auto key = std::make_pair(adapter, m.down_key);
  const auto found = sparse_.find(key);
  if (found != sparse_.end()) return found->second;
  std::vector<std::pair<int64_t, int64_t>> rows(static_cast<size_t>(m.parts));  // part -> (first row, count)
  for (const auto& sibling : adapters_[adapter].file.modules)
    if (sibling.down_key == m.down_key) rows[static_cast<size_t>(sibling.part)] = {sibling.row_offset, sibling.out_features};
  at::Tensor up = io::tensor_view(files_[adapter], files_[adapter]->at(m.up_key));
  if (m.up_multiplier != 1.0) up = up * m.up_multiplier;
  const int64_t part_rank = m.rank / m.parts;
  bool sparse = true;
  for (int j = 0; j < m.parts && sparse; ++j)
    for (int k = 0; k < m.parts && sparse; ++k) {
      if (j == k) continue;
      const auto [first, count] = rows[static_cast<size_t>(j)];
      sparse = up.narrow(0, first, count).narrow(1, k * part_rank, part_rank).eq(0).all().item<bool>();
    }
  sparse_[key] = sparse;
  return sparse;
}

std::vector<LowRankFactors> LoraSet::load_factors(io::LoraComponent component, const std::string& module,
                                                  at::ScalarType dtype, const at::Device& device) const {
  std::vector<LowRankFactors> out;
  const auto found = index_.find({component, module});
  if (found == index_.end()) return out;
  for (const Entry& e : found->second) {
    const io::LoraModule& m = *e.module;
    const auto& file = files_[e.adapter];
    at::Tensor down = io::tensor_view(file, file->at(m.down_key));
    at::Tensor up = io::tensor_view(file, file->at(m.up_key)).narrow(0, m.row_offset, m.out_features);
    int64_t rank = m.rank;
    if (block_diagonal(e.adapter, m)) {
      rank = m.rank / m.parts;
      down = down.narrow(0, m.part * rank, rank);
      up = up.narrow(1, m.part * rank, rank);
    }
    // kohya's folded alpha, multiplied in the file's dtype as diffusers does before PEFT casts the factors.
    if (m.down_multiplier != 1.0) down = down * m.down_multiplier;
    if (m.up_multiplier != 1.0) up = up * m.up_multiplier;
    LowRankFactors f;
    f.adapter = e.adapter;
    f.down = down.to(device, dtype).contiguous();
    f.up = up.to(device, dtype).contiguous();
    f.alpha = m.alpha;
    f.rank = rank;
    f.row_offset = 0;
    out.push_back(std::move(f));
  }
  return out;
}

at::Tensor LoraSet::merged(io::LoraComponent component, const std::string& module, const at::Tensor& weight) const {
  const auto factors = load_factors(component, module, weight.scalar_type(), weight.device());
  if (factors.empty()) return weight;
  // A copy: the loaded weight may be a view of the mapped model file.
  at::Tensor sum = weight.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  for (const auto& f : factors) {
    const double weight_of_adapter = selections_.front()[f.adapter];
    if (weight_of_adapter == 0) continue;
    // PEFT's get_delta_weight: (B @ A) * scaling, with the factors in the run dtype (upcast for the product).
    sum.add_(at::matmul(f.up.to(at::kFloat), f.down.to(at::kFloat)) * io::lora_scaling(f.alpha, f.rank, weight_of_adapter));
  }
  return sum.to(weight.scalar_type());
}

int64_t LoraSet::max_rank() const {
  int64_t r = 0;
  for (const auto& a : adapters_) r = std::max(r, a.file.max_rank());
  return r;
}

std::string LoraSet::fingerprint() const {
  std::string text = lora_mode_name(mode_);
  for (const auto& a : adapters_) text += " " + a.spec.name + ":" + io::lora_fingerprint(a.file, a.spec);
  for (const auto& s : selections_) {
    text += " [";
    for (double w : s) {
      char number[32];
      std::snprintf(number, sizeof number, "%a,", w);
      text += number;
    }
    text += "]";
  }
  return text;
}

std::shared_ptr<const LoraBinding> LoraBinding::make(std::shared_ptr<const LoraSet> set, io::LoraComponent component) {
  if (!set || !set->touches(component)) return nullptr;
  auto binding = std::make_shared<LoraBinding>();
  binding->component = component;
  if (set->mode() == LoraMode::unfused) binding->rows = std::make_shared<AdapterRows>(set->selections().front());
  binding->set = std::move(set);
  return binding;
}

void LoraBinding::apply(const std::string& key, Linear& layer) const {
  std::string module = key;
  if (component == io::LoraComponent::text_encoder && module.rfind("text_model.", 0) == 0) module = module.substr(11);
  if (!set->touches(component, module)) return;
  if (set->mode() == LoraMode::fused) {
    layer.weight = set->merged(component, module, layer.weight);
    return;
  }
  auto factors = set->load_factors(component, module, layer.weight.scalar_type(), layer.weight.device());
  layer.adapters = std::make_shared<const LowRankAdapters>(std::move(factors), rows);
}

void LoraBinding::select_rows(const std::vector<int64_t>& selection_per_row) const {
  if (!rows) return;
  std::vector<AdapterWeights> weights;
  for (int64_t s : selection_per_row) {
    DP_CHECK(s >= 0 && s < static_cast<int64_t>(set->selections().size()), "adapter choice ", s, " of ",
             set->selections().size());
    weights.push_back(set->selections()[static_cast<size_t>(s)]);
  }
  rows->set_rows(std::move(weights));
}

}  // namespace dp::models
