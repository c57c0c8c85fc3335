#include "cli/generate_microbatch.h"

#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "io/run_dtype.h"
#include "io/torch_tensors.h"
#include "pipeline/device_stats.h"
#include "placement/calibration.h"
#include "placement/flux_module_tree.h"
#include "placement/microbatch_choice.h"
#include "placement/plan.h"

namespace dp::cli {

int64_t choose_generate_microbatch(const runtime::RuntimeOptions& options, const pipeline::GenerateRequest& request,
                                   const pipeline::LatentGrid& grid, const std::string& model_dir, int world_size,
                                   const at::Device& device, bool coordinator) {
  if (options.sequence_parallel > 1 || (!options.device_map.empty() && options.device_map != "pipeline")) {
    if (coordinator)
      DP_INFO("microbatch size 1 chosen: the choice simulates the \"pipeline\" ring without sequence parallelism");
    return 1;
  }
  placement::MicrobatchRequest m;
  m.config = placement::read_transformer_config(model_dir);
  m.dtype = io::to_safetensors_dtype(request.dtype);
  const auto tree = placement::flux_module_tree(m.config, m.dtype);
  m.tree = &tree;
  std::optional<placement::ModuleTree> fp8_tree;  // only under --fp8-gemms: the tree is built for nothing else
  if (options.fp8_gemms) {
    fp8_tree = placement::flux_module_tree(m.config, m.dtype, placement::BlockWeights::fp8_gemms);
    m.fp8_tree = &*fp8_tree;
  }
  if (!options.max_memory.empty()) {
    m.max_memory = placement::read_max_memory_argument(options.max_memory);
  } else {
    // As plan assumes without --max-memory: every rank an H200's memory (the CPU has no cap to plan for).
    for (int g = 0; g < world_size; ++g) m.max_memory.set(placement::Device::gpu(g), 141'000'000'000);
  }
  m.cuda_caps = device.is_cuda() && !options.max_memory.empty();
  m.timing.height = grid.height / 2 * 16;
  m.timing.width = grid.width / 2 * 16;
  m.timing.text_tokens = request.max_sequence_length;
  m.images = request.batch();
  m.steps = request.steps;
  m.link = placement::link_preset(device.is_cuda() ? "nvlink" : "pcie");
  m.key = {pipeline::device_name(device), io::run_dtype_name(m.dtype), m.timing.height, m.timing.width,
           m.timing.text_tokens, 1};
  if (!options.no_calibration) {
    const auto file = placement::choose_calibration(options.calibration, m.key);
    for (const auto& e : file.entries)
      if (e.key.device == m.key.device) m.calibrations.push_back(e);
  }
  m.curve = placement::efficiency_curve(m.calibrations, m.key);
  const auto choice = placement::choose_microbatch(m);
  if (coordinator) DP_INFO("generate: ", choice.reason, " (--microbatch-size N overrides)");
  return choice.size;
}

}  // namespace dp::cli
