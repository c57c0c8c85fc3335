// `diffpipe inspect --lora FILE`: what a LoRA adapter holds as diffusers reads it (layout, ranks, alphas, the
// diffusers modules it changes, the keys diffusers ignores), from the header and its scalar alphas only; with
// --model, fitted to that pipeline's configs; with a device map (or --world-size), which blocks each rank holds and
// which of the adapter's tensors it reads. Torch-free, like the rest of inspect.
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "cli/format.h"
#include "cli/inspect_lora.h"
#include "core/error.h"
#include "core/json_file.h"
#include "io/lora_file.h"
#include "io/model_folder.h"
#include "models/clip/clip_config.h"
#include "models/flux/flux_config.h"
#include "models/lora_check.h"
#include "placement/plan.h"
#include "placement/ring_stages.h"

namespace dp::cli {
namespace {

std::string alpha_text(const io::LoraModule& m) {
  if (m.alpha.equals_rank) return m.down_multiplier * m.up_multiplier != 1.0 ? "folded" : "rank";
  std::ostringstream out;
  out << m.alpha.value;
  if (m.alpha.tensor_dtype) out << " (" << io::dtype_name(*m.alpha.tensor_dtype) << ")";
  return out.str();
}

// The modules of `file` a rank holding `stage` (and the embedders / the head when it is the first / last) reads.
bool reads(const io::LoraModule& m, const placement::RankStage& stage, bool first, bool last) {
  if (m.component != io::LoraComponent::transformer) return false;
  if (m.block >= 0) return m.block >= stage.first_block && m.block < stage.last_block;
  return models::flux_module_is_embedder(m.module) ? first : last;
}

}  // namespace

void inspect_lora(const LoraInspectOptions& o) {
  io::LoraFile file = io::read_lora_file(o.path);
  std::optional<models::FluxConfig> flux;
  std::vector<placement::RankStage> stages;
  if (!o.model.empty()) {
    const auto folder = io::ModelFolder::open(o.model);
    const std::string flux_path = folder.component("transformer").path + "/config.json";
    flux = models::FluxConfig::from_json(read_json_file(flux_path), flux_path);
    std::optional<models::ClipTextConfig> clip;
    if (folder.has("text_encoder")) {
      const std::string clip_path = folder.component("text_encoder").path + "/config.json";
      clip = models::ClipTextConfig::from_json(read_json_file(clip_path), clip_path);
    }
    models::fit_lora_to_model(file, *flux, clip ? &*clip : nullptr);
    if (!o.device_map.empty() || o.world_size > 0) {
      placement::PlanRequest request;
      request.model_dir = o.model;
      request.device_map = o.device_map.empty() ? "pipeline" : o.device_map;
      if (!o.max_memory.empty()) request.max_memory = placement::read_max_memory_argument(o.max_memory);
      if (o.world_size > 0) request.world_size = o.world_size;
      const auto plan = placement::make_plan(request);
      const int world = o.world_size > 0 ? o.world_size : plan.at("world_size").get<int>();
      stages = placement::ring_stages(plan.at("hf_device_map"), *flux, world);
    }
  } else {
    DP_CHECK(o.device_map.empty() && o.world_size == 0, "inspect --lora: a device map or --world-size needs --model");
  }

  std::map<std::string, int64_t> per_component;
  for (const auto& m : file.modules) per_component[io::lora_component_name(m.component)] += 1;
  nlohmann::ordered_json report = {{"lora", o.path},
                                   {"layout", io::lora_layout_name(file.layout)},
                                   {"modules", file.modules.size()},
                                   {"modules_per_component", per_component},
                                   {"rank", {file.min_rank(), file.max_rank()}},
                                   {"ignored", file.ignored},
                                   {"targets", nlohmann::ordered_json::array()}};
  for (const auto& m : file.modules) {
    nlohmann::ordered_json t = {{"component", io::lora_component_name(m.component)},
                                {"module", m.module},
                                {"rank", m.rank},
                                {"alpha", alpha_text(m)},
                                {"scaling_at_scale_1", io::lora_scaling(m.alpha, m.rank, 1.0) * m.down_multiplier * m.up_multiplier},
                                {"down", m.down_key},
                                {"up", m.up_key}};
    if (m.parts > 1) t["split"] = str("part ", m.part + 1, " of ", m.parts);
    if (flux) t["block"] = m.block;
    report["targets"].push_back(t);
  }
  if (!stages.empty()) {
    report["ranks"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < stages.size(); ++i) {
      const bool first = i == 0, last = i + 1 == stages.size();
      int64_t modules = 0;
      std::set<std::string> keys;
      for (const auto& m : file.modules)
        if (reads(m, stages[i], first, last)) {
          ++modules;
          keys.insert(m.down_key);
          keys.insert(m.up_key);
        }
      report["ranks"].push_back({{"rank", stages[i].rank},
                                 {"blocks", {stages[i].first_block, stages[i].last_block}},
                                 {"embedders", first},
                                 {"head", last},
                                 {"lora_modules", modules},
                                 {"lora_tensors", keys.size()}});
    }
  }
  if (o.json) {
    std::cout << report.dump(2) << "\n";
    return;
  }
  std::cout << "LoRA: " << o.path << "\nlayout: " << io::lora_layout_name(file.layout) << ", " << file.modules.size()
            << " module(s)";
  for (const auto& [component, count] : per_component) std::cout << " (" << component << " " << count << ")";
  std::cout << ", rank " << file.min_rank();
  if (file.max_rank() != file.min_rank()) std::cout << "-" << file.max_rank();
  std::cout << "\n";
  for (const auto& why : file.ignored) std::cout << "ignored (as diffusers ignores it): " << why << "\n";
  std::cout << "  " << std::left << std::setw(14) << "component" << std::setw(46) << "module" << std::right
            << std::setw(6) << "rank" << std::setw(16) << "alpha" << std::setw(10) << "scaling"
            << (flux ? "  block" : "") << "\n";
  for (const auto& m : file.modules) {
    std::cout << "  " << std::left << std::setw(14) << io::lora_component_name(m.component) << std::setw(46)
              << (m.parts > 1 ? str(m.module, " [", m.part + 1, "/", m.parts, "]") : m.module) << std::right
              << std::setw(6) << m.rank << std::setw(16) << alpha_text(m) << std::setw(10) << std::setprecision(4)
              << io::lora_scaling(m.alpha, m.rank, 1.0) * m.down_multiplier * m.up_multiplier;
    if (flux) std::cout << "  " << (m.block >= 0 ? std::to_string(m.block) : std::string("-"));
    std::cout << "\n";
  }
  for (const auto& r : report.value("ranks", nlohmann::ordered_json::array()))
    std::cout << "rank " << r["rank"].get<int>() << ": blocks [" << r["blocks"][0].get<int64_t>() << ", "
              << r["blocks"][1].get<int64_t>() << ")" << (r["embedders"].get<bool>() ? " + embedders" : "")
              << (r["head"].get<bool>() ? " + head" : "") << ": reads " << r["lora_modules"].get<int64_t>()
              << " adapted module(s), " << r["lora_tensors"].get<size_t>() << " LoRA tensor(s)\n";
}

}  // namespace dp::cli
