// `diffpipe calibrate`: times one double block, one single block, the embedders and the output layers of a
// model folder on the given device, at a run's shape, dtype and microbatch sizes, and records the medians in a
// calibration file (placement/calibration.h) that plan and generate plan the "pipeline" split from. Only the
// first double block, the first single block, the embedders and the head are loaded: every block of a kind
// has the same shapes, so one of each times them all.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/command.h"
#include "cli/torch_boundary.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/json_file.h"
#include "io/run_dtype.h"
#include "io/torch_tensors.h"
#include "models/flux/flux_config.h"
#include "pipeline/block_timing.h"
#include "io/model_folder.h"
#include "pipeline/device_stats.h"
#include "pipeline/flux_pipeline.h"
#include "pipeline/latent_layout.h"
#include "placement/calibration.h"

namespace dp::cli {
namespace {

struct CalibrateOptions {
  std::string model, device = "auto", dtype, microbatches = "1", calibration;
  int64_t height = 1024, width = 1024, text_tokens = 512;
  int warmup = 2, repeat = 5, threads = 0;
};

std::vector<int64_t> parse_microbatches(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    int64_t m = 0;
    size_t used = 0;
    try {
      m = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DP_CHECK(used == item.size() && m >= 1 && m <= 4096, "--microbatch-size '", text, "': '", item,
             "' is not a microbatch size from 1 to 4096");
    out.push_back(m);
  }
  DP_CHECK(!out.empty(), "--microbatch-size '", text, "' names no size; give one or more, as in 1,2,4");
  return out;
}

std::string transformer_dir(const std::string& model) {
  const auto sub = std::filesystem::path(model) / "transformer";
  return std::filesystem::is_directory(sub) ? sub.string() : model;
}

void run_calibrate(CalibrateOptions o) {
  c10::InferenceMode guard;
  o.device = resolve_device_name(o.device);  // generate's rule: a visible GPU by default
  if (o.threads > 0) at::set_num_threads(o.threads);
  DP_CHECK(o.warmup >= 0 && o.repeat >= 1 && o.repeat <= 1000, "--repeat must be 1 to 1000 and --warmup non-negative");
  DP_CHECK(o.text_tokens >= 1, "--text-tokens must be at least 1, got ", o.text_tokens);
  const auto microbatches = parse_microbatches(o.microbatches);
  const at::Device device = usable_device(o.device);
  const std::string dtype_name = o.dtype.empty() ? default_dtype_for(o.device) : o.dtype;
  const at::ScalarType dtype = io::parse_run_scalar_type(dtype_name);
  const std::string path = o.calibration.empty() ? placement::default_calibration_path() : o.calibration;
  const std::string dir = transformer_dir(o.model);
  const std::string config_path = dir + "/config.json";
  DP_CHECK(std::filesystem::exists(config_path), o.model, ": no transformer config (looked for ", config_path, ")");
  const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
  auto weights = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(dir));
  const std::string name = pipeline::device_name(device);
  const std::string canonical_dtype = io::run_dtype_name(io::parse_run_dtype(dtype_name));
  // The grid generate computes for this size: with the folder's VAE factor (a pipeline folder), else FLUX's 8.
  const bool pipeline_folder = std::filesystem::exists(std::filesystem::path(o.model) / "model_index.json");
  const int64_t vae_factor =
      pipeline_folder ? pipeline::FluxPipeline(io::ModelFolder::open(o.model)).vae_scale_factor() : int64_t{8};
  const auto grid = pipeline::latent_grid(o.height, o.width, vae_factor);
  const int64_t height = grid.height / 2 * 16, width = grid.width / 2 * 16;
  mark_work_started();  // inputs checked: from here a failure is a runtime error (exit 1)
  std::cerr << "calibrating " << dir << " on " << name << ", " << canonical_dtype << ", " << height << "x" << width
            << ", " << o.text_tokens << " text tokens; " << o.warmup << " warm-up and " << o.repeat
            << " timed run(s) per unit\n";

  std::vector<placement::CalibrationEntry> entries;
  for (const int64_t m : microbatches) {
    const auto t = pipeline::time_flux_blocks({weights, config, dtype, device, grid, o.text_tokens, m, o.warmup, o.repeat});
    placement::CalibrationEntry e;
    e.key = {name, canonical_dtype, height, width, o.text_tokens, m};
    e.runs = t.runs;
    e.times = {t.embedders_ms, t.double_block_ms, t.single_block_ms, t.output_ms};
    std::cerr << std::fixed << std::setprecision(3) << "  microbatch " << m << ": embedders " << e.times.embedders_ms
              << " ms, double block " << e.times.double_block_ms << " ms, single block " << e.times.single_block_ms
              << " ms, output " << e.times.output_ms << " ms\n";
    entries.push_back(e);
  }
  placement::write_calibration(path, entries);
  std::cout << "calibration: wrote " << entries.size() << " entr" << (entries.size() == 1 ? "y" : "ies") << " for "
            << name << " to " << path << "\n";
  for (const auto& e : entries) {
    const double step = e.times.embedders_ms + config.num_layers * e.times.double_block_ms +
                        config.num_single_layers * e.times.single_block_ms + e.times.output_ms;
    std::cout << std::fixed << std::setprecision(3) << "  " << placement::describe_key(e.key) << ": double "
              << e.times.double_block_ms << " ms, single " << e.times.single_block_ms << " ms, embedders "
              << e.times.embedders_ms << " ms, output " << e.times.output_ms << " ms; a whole step "
              << step << " ms, " << step / static_cast<double>(e.key.microbatch) << " ms per image\n";
  }
}

CommandRegistrar registrar("calibrate", 45, [](CLI::App& root) {
  auto o = std::make_shared<CalibrateOptions>();
  auto* cmd = root.add_subcommand("calibrate", kCalibrateSummary);
  cmd->add_option("--model", o->model, "model folder (or its transformer/ folder)")->required();
  cmd->add_option("--device", o->device, "auto (cuda when a GPU is visible, else cpu), cpu or cuda")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "bf16, fp16 or fp32 (default: bf16 on CUDA, fp32 on CPU, as generate)");
  cmd->add_option("--height", o->height, "image height in pixels, as generate's")->capture_default_str();
  cmd->add_option("--width", o->width, "image width in pixels, as generate's")->capture_default_str();
  cmd->add_option("--text-tokens,--max-sequence-length", o->text_tokens, "text tokens (T5 max_sequence_length)")
      ->capture_default_str();
  cmd->add_option("--microbatch-size", o->microbatches,
                  "microbatch size(s) to time, comma-separated (several give plan and generate an efficiency curve)")
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed runs of each unit first")->capture_default_str();
  cmd->add_option("--repeat", o->repeat, "timed runs of each unit; the median is recorded")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (default: LibTorch's choice; part of the CPU's name)");
  cmd->add_option("--calibration", o->calibration,
                  "calibration file to add the entries to (default: " + placement::default_calibration_path() + ")");
  cmd->callback([o] { run_reporting_torch_errors([&] { run_calibrate(*o); }); });
});

}  // namespace
}  // namespace dp::cli
