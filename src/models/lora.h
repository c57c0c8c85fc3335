#pragma once
// LoRA adapters applied by the models, as diffusers' load_lora_weights + set_adapters (PEFT) applies them.
//
//   fused    each Linear's weight gets every adapter's scale * alpha / r * B A added when the Linear loads, block
//            by block (the sum in float32, one rounding to the run dtype), so there is never a second copy of
//            the transformer and the forward is the plain one. The model files are never written.
//   unfused  the base weights stay as they are; each adapted Linear keeps the adapters' factors (in the run
//            dtype, as PEFT keeps them) and adds (B (A x)) * scaling per adapter in the forward, in PEFT's order
//            and rounding. The weights of the adapters may differ per batch row (one prompt may use other
//            adapters than the next): the model's AdapterRows says which, and whoever runs the forward sets it.
//
// Loading reads only the factors of the modules being built, so a rank holding some blocks reads only those
// blocks' adapter tensors (check_finite does the same for its reads).
#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/lora_file.h"

namespace dp::models {

struct Linear;

enum class LoraMode { fused, unfused };
const char* lora_mode_name(LoraMode mode);
LoraMode parse_lora_mode(const std::string& name);  // "fused" or "unfused"; throws naming the value

// The weight of each adapter, in the run's adapter order, for one choice of adapters (0: off).
using AdapterWeights = std::vector<double>;

struct LoraAdapter {
  io::LoraSpec spec;
  io::LoraFile file;  // fitted to the model (models::fit_lora_to_model)
};

// Which adapter weights each row of the batch running now uses (unfused mode).
class AdapterRows {
 public:
  explicit AdapterRows(AdapterWeights uniform) { set_uniform(std::move(uniform)); }
  void set_uniform(AdapterWeights weights);
  void set_rows(std::vector<AdapterWeights> rows);  // one entry per batch row
  bool uniform() const { return rows_.size() == 1 && !per_row_; }
  size_t rows() const { return rows_.size(); }
  const AdapterWeights& row(size_t i) const { return rows_[uniform() ? 0 : i]; }

 private:
  std::vector<AdapterWeights> rows_;
  bool per_row_ = false;
};

// One adapter's factors on one Linear: out[..., row_offset : row_offset + up.size(0)] += B (A x) * scaling.
struct LowRankFactors {
  size_t adapter = 0;
  at::Tensor down, up;  // (rank, in) and (out, rank), in the run dtype on the run device
  io::LoraAlpha alpha;
  int64_t rank = 0;
  int64_t row_offset = 0;
};

// The unfused adapters of one Linear.
class LowRankAdapters {
 public:
  LowRankAdapters(std::vector<LowRankFactors> factors, std::shared_ptr<const AdapterRows> rows)
      : factors_(std::move(factors)), rows_(std::move(rows)) {}
  // y = base(x) on entry; adds every active adapter's low-rank output in place, adapter by adapter.
  void add_to(at::Tensor& y, const at::Tensor& x) const;
  // The same adapters with every tensor passed through `f` (offloaded blocks' host/device copies).
  std::shared_ptr<const LowRankAdapters> map(const std::function<at::Tensor(const at::Tensor&)>& f) const;
  // Concatenated Linears (q, k, v as one GEMM): `parts`' adapters with their rows shifted to each part's place.
  static std::shared_ptr<const LowRankAdapters> concat(const std::vector<const Linear*>& parts);
  const std::vector<LowRankFactors>& factors() const { return factors_; }
  uint64_t nbytes() const;

 private:
  std::vector<LowRankFactors> factors_;
  std::shared_ptr<const AdapterRows> rows_;
};

// The adapters of a run, as the models read them.
class LoraSet {
 public:
  // `adapters` in the user's order, each fitted to the model; `selections[0]` is the default choice (every
  // adapter at its --lora scale); fused mode uses only that one. Maps every file; reads no factor.
  LoraSet(std::vector<LoraAdapter> adapters, LoraMode mode, std::vector<AdapterWeights> selections);

  LoraMode mode() const { return mode_; }
  const std::vector<LoraAdapter>& adapters() const { return adapters_; }
  const std::vector<AdapterWeights>& selections() const { return selections_; }
  bool touches(io::LoraComponent component) const;
  bool touches(io::LoraComponent component, const std::string& module) const;
  // Reads the factors of the modules `holds` accepts and throws naming the file and key of the first NaN or
  // infinity: a rank calls it for its blocks before it loads them.
  void check_finite(io::LoraComponent component, const std::function<bool(const io::LoraModule&)>& holds) const;
  // Every adapter's factors for `module`, converted as diffusers converts them (kohya's folded alpha, the rows
  // and, for a block-diagonal up factor, the rank slice of a split projection), in `dtype` on `device`.
  std::vector<LowRankFactors> load_factors(io::LoraComponent component, const std::string& module,
                                           at::ScalarType dtype, const at::Device& device) const;
  // Fused: `weight` with every adapter's delta at the default weights added (float32 sum, one rounding).
  at::Tensor merged(io::LoraComponent component, const std::string& module, const at::Tensor& weight) const;
  // The largest rank of any adapter (the memory preflight's unfused path).
  int64_t max_rank() const;
  // The files, names, scales, mode and choices as one digest: ranks agree on it, checkpoints store it.
  std::string fingerprint() const;

 private:
  struct Entry {
    size_t adapter;
    const io::LoraModule* module;
  };
  bool block_diagonal(size_t adapter, const io::LoraModule& m) const;

  std::vector<LoraAdapter> adapters_;
  LoraMode mode_;
  std::vector<AdapterWeights> selections_;
  std::vector<std::shared_ptr<io::SafetensorsFile>> files_;
  std::map<std::pair<io::LoraComponent, std::string>, std::vector<Entry>> index_;
  mutable std::mutex sparse_mutex_;
  mutable std::map<std::pair<size_t, std::string>, bool> sparse_;  // (adapter, down key) -> block-diagonal
};

// What a model's loader needs to apply a run's adapters to its Linears.
struct LoraBinding {
  std::shared_ptr<const LoraSet> set;
  io::LoraComponent component = io::LoraComponent::transformer;
  std::shared_ptr<AdapterRows> rows;  // unfused: the model's row weights, read by its Linears
  // For a model: rows start at the default selection.
  static std::shared_ptr<const LoraBinding> make(std::shared_ptr<const LoraSet> set, io::LoraComponent component);
  // Merges (fused) or attaches (unfused) the adapters of `module` (the checkpoint key of the Linear, without
  // ".weight"; a CLIP "text_model." prefix is ignored) to a freshly loaded Linear.
  void apply(const std::string& module, Linear& layer) const;
  // Sets the rows' weights from per-row selection indices (unfused); throws for an index outside the choices.
  void select_rows(const std::vector<int64_t>& selection_per_row) const;
};

}  // namespace dp::models
