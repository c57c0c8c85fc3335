// `diffpipe forward`: one or more transformer forwards on seeded random inputs, optionally split into
// stages in one process exactly as ranks would split it. The demo and the CPU benchmark use it.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#ifdef DIFFPIPE_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "cli/command.h"
#include "cli/torch_boundary.h"
#include "pipeline/device_stats.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/json_file.h"
#include "core/log.h"
#include "core/output_policy.h"
#include "io/torch_tensors.h"
#include "models/flux/flux_transformer.h"
#include "models/flux/fp8_gemm.h"
#include "models/lora.h"
#include "models/lora_check.h"
#include "pipeline/latent_layout.h"

namespace dp::cli {
namespace {

struct ForwardOptions {
  std::string model;
  int64_t height = 256, width = 256, text_len = 32, batch = 1;
  std::string dtype, device = "auto", stages, inputs, save;
  int repeat = 3, warmup = 1, threads = 0;
  bool cuda_graph = false;
  bool fp8_gemms = false;
  std::vector<std::string> lora;  // [NAME=]FILE[:SCALE]
  std::string lora_mode = "fused";
  uint64_t seed = 0;
  double guidance = 3.5, timestep = 0.75;
};

std::string transformer_dir(const std::string& model) {
  const auto sub = std::filesystem::path(model) / "transformer";
  return std::filesystem::is_directory(sub) ? sub.string() : model;
}

// "0:3,3:7" -> {0, 3, 7}; stages must tile [0, blocks).
std::vector<int64_t> parse_stages(const std::string& spec, int64_t blocks) {
  if (spec.empty()) return {0, blocks};
  std::vector<int64_t> bounds;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto colon = item.find(':');
    DP_CHECK(colon != std::string::npos, "--stages: '", item, "' is not FIRST:LAST");
    int64_t first = 0, last = 0;
    try {
      first = std::stoll(item.substr(0, colon));
      last = std::stoll(item.substr(colon + 1));
    } catch (const std::exception&) {
      DP_FAIL("--stages: '", item, "' is not FIRST:LAST with integers");
    }
    DP_CHECK(bounds.empty() ? first == 0 : first == bounds.back(), "--stages: '", item,
             "' must start where the previous stage ended (", bounds.empty() ? 0 : bounds.back(), ")");
    DP_CHECK(last > first, "--stages: '", item, "' is empty");
    if (bounds.empty()) bounds.push_back(first);
    bounds.push_back(last);
  }
  DP_CHECK(!bounds.empty() && bounds.back() == blocks, "--stages must end at block ", blocks, ", the model's last");
  return bounds;
}

models::FluxInputs make_inputs(const ForwardOptions& o, const models::FluxConfig& config) {
  if (!o.inputs.empty()) {
    auto file = io::SafetensorsFile::open(o.inputs);
    auto get = [&](const std::string& key) {
      const auto* info = file->find("input." + key);
      return info ? io::tensor_view(file, *info).clone() : at::Tensor();
    };
    return {get("hidden_states"), get("encoder_hidden_states"), get("pooled_projections"), get("timestep"),
            get("img_ids"),       get("txt_ids"),               get("guidance")};
  }
  // The transformer alone has no VAE, so the grid uses FluxPipeline's factor for a pipeline without one.
  const auto grid = pipeline::latent_grid(o.height, o.width, pipeline::kVaeScaleFactorWithoutVae);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  models::FluxInputs in;
  in.hidden_states = at::randn({o.batch, grid.tokens(), config.in_channels}, gen);
  in.encoder_hidden_states = at::randn({o.batch, o.text_len, config.joint_attention_dim}, gen);
  in.pooled_projections = at::randn({o.batch, config.pooled_projection_dim}, gen);
  in.timestep = at::full({o.batch}, o.timestep);
  in.img_ids = pipeline::latent_image_ids(grid);
  in.txt_ids = at::zeros({o.text_len, 3});
  if (config.guidance_embeds) in.guidance = at::full({o.batch}, o.guidance);
  return in;
}

// Captures the whole forward (every stage) into one CUDA graph and times its replays: the launch gaps
// between LibTorch's kernels disappear, which shows how much of a step is launch overhead.
void run_graphed(const ForwardOptions& o, const std::vector<models::FluxTransformer>& stages,
                 const std::vector<int64_t>& bounds, const models::FluxInputs& inputs, models::FluxInputs run_in,
                 const at::Device& device) {
#ifdef DIFFPIPE_HAVE_CUDA
  DP_CHECK(device.is_cuda(), "--cuda-graph needs --device cuda");
  run_in.timestep = run_in.timestep.to(device);
  if (run_in.guidance.defined()) run_in.guidance = run_in.guidance.to(device);
  std::vector<models::flux::RotaryTables> ropes;
  for (const auto& stage : stages) ropes.push_back(stage.rotary(inputs.txt_ids, inputs.img_ids));
  auto forward_all = [&] {
    models::FluxActivations state = stages.front().embed(run_in);
    for (size_t s = 0; s < stages.size(); ++s) stages[s].run_blocks(state, ropes[s], bounds[s], bounds[s + 1]);
    return stages.back().head(state);
  };
  const uint64_t weights_peak = pipeline::peak_memory_bytes(device);
  pipeline::reset_peak_memory(device);
  at::Tensor output;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
    for (int w = 0; w < std::max(1, o.warmup); ++w) output = forward_all();  // allocator and cuBLAS warm-up
    pipeline::synchronize(device);
    graph.capture_begin();
    output = forward_all();
    graph.capture_end();
  }
  pipeline::synchronize(device);
  std::vector<double> times;
  for (int r = 0; r < o.warmup + o.repeat; ++r) {
    const auto started = std::chrono::steady_clock::now();
    graph.replay();
    pipeline::synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    if (r >= o.warmup) times.push_back(ms);
    std::cerr << (r < o.warmup ? "warmup " : "run ") << (r < o.warmup ? r + 1 : r - o.warmup + 1) << "/"
              << (r < o.warmup ? o.warmup : o.repeat) << ": " << std::fixed << std::setprecision(2) << ms << " ms\n";
  }
  double total = 0, best = times.front();
  for (double t : times) total += t, best = std::min(best, t);
  const at::Tensor out32 = output.to(at::kCPU, at::kFloat);
  std::cout << std::setprecision(3) << "forward (CUDA graph): mean " << total / times.size() << " ms, best " << best
            << " ms over " << times.size() << " replay(s); output " << output.sizes() << " mean "
            << out32.mean().item<double>() << " std " << out32.std().item<double>() << "\n";
  std::cout << "memory (cuda): after load " << weights_peak / 1e9 << " GB, peak during forwards "
            << pipeline::peak_memory_bytes(device) / 1e9 << " GB (allocated)\n";
#else
  DP_FAIL("--cuda-graph needs a build with CUDA");
#endif
}

void run_forward(ForwardOptions o) {
  c10::InferenceMode guard;
  // generate's rules: a visible GPU by default, and bf16 on it (fp32 on the CPU) unless --dtype says.
  o.device = resolve_device_name(o.device);
  if (o.dtype.empty()) o.dtype = default_dtype_for(o.device);
  if (o.threads > 0) at::set_num_threads(o.threads);
  // Checked before the weights load, as generate checks its outputs (core/output_policy.h).
  if (!o.save.empty()) {
    try {
      check_output_path(o.save);
    } catch (const Error& e) {
      throw Error(str("--save ", e.what()), e.file(), e.line());
    }
  }
  const at::ScalarType dtype = io::parse_run_scalar_type(o.dtype);
  const at::Device device = usable_device(o.device);
  const std::string dir = transformer_dir(o.model);
  const std::string config_path = dir + "/config.json";
  DP_CHECK(std::filesystem::exists(config_path), o.model, ": no transformer config (looked for ", config_path, ")");
  const auto config = models::FluxConfig::from_json(read_json_file(config_path), config_path);
  const auto bounds = parse_stages(o.stages, config.num_blocks());
  auto weights = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(dir));

  mark_work_started();  // from here a failure is a runtime error (exit 1), before it an input error (3)
  auto load_started = std::chrono::steady_clock::now();
  std::shared_ptr<const models::LoraSet> lora;
  if (!o.lora.empty()) {
    // The adapters' headers, fitted to the config; their factors are read (and merged, in fused mode) as each
    // block loads, which the load time below includes.
    std::vector<models::LoraAdapter> adapters;
    models::AdapterWeights weights_of_adapters;
    for (const auto& word : o.lora) {
      const auto spec = io::parse_lora_spec(word);
      io::LoraFile file = io::read_lora_file(spec.path);
      // forward runs the transformer alone: an adapter's text-encoder modules have nothing to change here.
      file.modules.erase(std::remove_if(file.modules.begin(), file.modules.end(),
                                        [](const io::LoraModule& m) { return m.component != io::LoraComponent::transformer; }),
                         file.modules.end());
      DP_CHECK(!file.modules.empty(), spec.path, ": the adapter changes no transformer module");
      models::fit_lora_to_model(file, config, nullptr);
      weights_of_adapters.push_back(spec.scale);
      adapters.push_back({spec, std::move(file)});
    }
    lora = std::make_shared<const models::LoraSet>(std::move(adapters), models::parse_lora_mode(o.lora_mode),
                                                   std::vector<models::AdapterWeights>{weights_of_adapters});
  }
  if (o.fp8_gemms) models::flux::set_fp8_gemms_enabled(true);
  std::vector<models::FluxTransformer> stages;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    models::FluxParts parts{s == 0, bounds[s], bounds[s + 1], s + 2 == bounds.size()};
    if (lora) {
      lora->check_finite(io::LoraComponent::transformer, [&](const io::LoraModule& m) {
        if (m.block >= 0) return m.block >= parts.first_block && m.block < parts.last_block;
        return models::flux_module_is_embedder(m.module) ? parts.embedders : parts.head;
      });
    }
    stages.push_back(models::FluxTransformer::load(weights, config, dtype, device, parts, lora));
  }
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_started).count();
  models::FluxInputs inputs = make_inputs(o, config);
  auto to_run = [&](const at::Tensor& t) { return t.defined() ? t.to(device, dtype) : t; };
  models::FluxInputs run_in = inputs;
  run_in.hidden_states = to_run(inputs.hidden_states);
  run_in.encoder_hidden_states = to_run(inputs.encoder_hidden_states);
  run_in.pooled_projections = to_run(inputs.pooled_projections);
  std::cerr << "transformer " << dir << ": " << config.num_layers << " double + " << config.num_single_layers
            << " single blocks, hidden " << config.inner_dim() << ", " << o.dtype << " on " << o.device << ", "
            << at::get_num_threads() << " threads; loaded in " << std::fixed << std::setprecision(1) << load_ms
            << " ms" << (lora ? str(" with ", o.lora.size(), " LoRA adapter(s), ", o.lora_mode) : std::string()) << "\n";
  std::cout << "load: " << std::fixed << std::setprecision(1) << load_ms << " ms"
            << (lora ? str(" (LoRA ", o.lora_mode, ")") : std::string()) << "\n";
  std::cerr << "inputs: batch " << inputs.hidden_states.size(0) << ", " << inputs.hidden_states.size(1)
            << " image tokens, " << inputs.encoder_hidden_states.size(1) << " text tokens; " << stages.size()
            << " stage(s):";
  for (size_t s = 0; s < stages.size(); ++s) std::cerr << " [" << bounds[s] << "," << bounds[s + 1] << ")";
  std::cerr << "\n";

  at::Tensor output;
  if (o.cuda_graph) {
    run_graphed(o, stages, bounds, inputs, run_in, device);
    return;
  }
  const uint64_t weights_peak = pipeline::peak_memory_bytes(device);
  pipeline::reset_peak_memory(device);
  std::vector<double> times;
  std::vector<double> stage_ms(stages.size(), 0.0);
  for (int r = 0; r < o.warmup + o.repeat; ++r) {
    const auto started = std::chrono::steady_clock::now();
    models::FluxActivations state;
    for (size_t s = 0; s < stages.size(); ++s) {
      const auto stage_started = std::chrono::steady_clock::now();
      if (s == 0) state = stages[s].embed(run_in);
      const auto rope = stages[s].rotary(inputs.txt_ids, inputs.img_ids);
      stages[s].run_blocks(state, rope, bounds[s], bounds[s + 1]);
      if (s + 1 == stages.size()) output = stages[s].head(state);
      if (stages.size() > 1) pipeline::synchronize(device);  // per-stage times only when there are stages to compare
      if (r >= o.warmup)
        stage_ms[s] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - stage_started).count();
    }
    pipeline::synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    if (r >= o.warmup) times.push_back(ms);
    std::cerr << (r < o.warmup ? "warmup " : "run ") << (r < o.warmup ? r + 1 : r - o.warmup + 1) << "/"
              << (r < o.warmup ? o.warmup : o.repeat) << ": " << std::setprecision(2) << ms << " ms\n";
  }
  DP_CHECK(!times.empty(), "--repeat must be at least 1");
  double total = 0, best = times.front();
  for (double t : times) total += t, best = std::min(best, t);
  output = output.to(at::kCPU);
  const at::Tensor out32 = output.to(at::kFloat);
  std::cout << std::setprecision(3) << "forward: mean " << total / times.size() << " ms, best " << best
            << " ms over " << times.size() << " run(s); output " << output.sizes() << " mean "
            << out32.mean().item<double>() << " std " << out32.std().item<double>() << "\n";
  std::cout << "memory (" << o.device << "): after load " << weights_peak / 1e9 << " GB, peak during forwards "
            << pipeline::peak_memory_bytes(device) / 1e9 << " GB" << (device.is_cuda() ? " (allocated)" : " (process RSS)")
            << "\n";
  for (size_t s = 0; s < stages.size() && stages.size() > 1; ++s)
    std::cout << "  stage " << s << " blocks [" << bounds[s] << "," << bounds[s + 1] << "): "
              << stage_ms[s] / times.size() << " ms\n";
  if (!o.save.empty()) {
    std::map<std::string, at::Tensor> tensors = {{"output", output},
                                                 {"input.hidden_states", inputs.hidden_states},
                                                 {"input.encoder_hidden_states", inputs.encoder_hidden_states},
                                                 {"input.pooled_projections", inputs.pooled_projections},
                                                 {"input.timestep", inputs.timestep},
                                                 {"input.img_ids", inputs.img_ids},
                                                 {"input.txt_ids", inputs.txt_ids}};
    if (inputs.guidance.defined()) tensors["input.guidance"] = inputs.guidance;
    io::save_tensors(o.save, tensors);
    std::cout << "saved inputs and output to " << o.save << "\n";
  }
}

CommandRegistrar registrar("forward", 40, [](CLI::App& root) {
  auto o = std::make_shared<ForwardOptions>();
  auto* cmd = root.add_subcommand("forward", kForwardSummary);
  cmd->add_option("--model", o->model, "model folder (or its transformer/ folder)")->required();
  cmd->add_option("--height", o->height, "image height in pixels (multiple of 16)")->capture_default_str();
  cmd->add_option("--width", o->width, "image width in pixels (multiple of 16)")->capture_default_str();
  cmd->add_option("--text-len", o->text_len, "text tokens (T5 max_sequence_length)")->capture_default_str();
  cmd->add_option("--batch", o->batch, "batch size")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "fp32, bf16 or fp16 (default: bf16 on CUDA, fp32 on CPU, as generate)");
  cmd->add_option("--device", o->device, "auto (cuda when a GPU is visible, else cpu), cpu or cuda")->capture_default_str();
  cmd->add_option("--stages", o->stages, "block ranges per stage, e.g. 0:3,3:6 (default: one stage)");
  cmd->add_option("--repeat", o->repeat, "timed forwards")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed forwards first")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (default: LibTorch's choice)");
  cmd->add_option("--seed", o->seed, "seed of the random inputs")->capture_default_str();
  cmd->add_option("--inputs", o->inputs, "read inputs from a safetensors file (input.* tensors) instead");
  cmd->add_option("--save", o->save, "write inputs and output to this safetensors file");
  cmd->add_flag("--cuda-graph", o->cuda_graph, "capture the forward in a CUDA graph and time its replays");
  cmd->add_flag("--fp8-gemms", o->fp8_gemms, "the blocks' projections as FP8 GEMMs, as generate takes it");
  cmd->add_option("--lora", o->lora, "a LoRA adapter, [NAME=]FILE[:SCALE], as generate takes it; repeatable");
  cmd->add_option("--lora-mode", o->lora_mode, "fused or unfused, as generate takes it")->capture_default_str();
  cmd->callback([o] { run_reporting_torch_errors([&] { run_forward(*o); }); });
});

}  // namespace
}  // namespace dp::cli
