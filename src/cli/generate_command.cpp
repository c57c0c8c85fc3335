// `diffpipe generate`: the whole FLUX pipeline in one process, with diffusers' defaults and numbers.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/format.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "io/hdf5_latents.h"
#include "io/png_image.h"
#include "io/torch_tensors.h"
#include "pipeline/flux_pipeline.h"
#include "runtime/distributed_generate.h"
#include "runtime/world.h"

namespace dp::cli {
namespace {

struct GenerateOptions {
  std::string model, prompts_file, report_json, out = "out.png", output_type = "png", dtype = "bf16", device = "cpu";
  std::vector<std::string> prompts;
  int num_images_per_prompt = 1, steps = 28, max_sequence_length = 512;
  int64_t height = 0, width = 0;  // 0: the model's default size
  double guidance = 3.5;
  uint64_t seed = 0;
  runtime::RuntimeOptions runtime;
};

std::vector<std::string> read_prompts_file(const std::string& path) {
  std::ifstream in(path);
  DP_CHECK(in.good(), path, ": cannot open prompts file");
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    prompts.push_back(line);
  }
  DP_CHECK(!prompts.empty(), path, ": prompts file has no prompt (one prompt a line; blank lines are skipped)");
  return prompts;
}

// --report-json: the stage reports and the denoising loop's step times, for benchmark scripts.
void write_report_json(const GenerateOptions& o, const pipeline::GenerateRequest& request,
                       const std::vector<pipeline::StageReport>& stages, const std::vector<double>& step_ends,
                       double total_seconds) {
  nlohmann::json doc = {{"model", o.model},
                        {"device", o.device},
                        {"dtype", o.dtype},
                        {"height", request.height},
                        {"width", request.width},
                        {"steps", request.steps},
                        {"batch", request.batch()},
                        {"total_seconds", total_seconds},
                        {"stages", nlohmann::json::array()}};
  for (const auto& s : stages)
    doc["stages"].push_back({{"name", s.name},
                             {"seconds", s.seconds},
                             {"load_seconds", s.load_seconds},
                             {"peak_resident_bytes", s.peak_resident_bytes},
                             {"peak_device_bytes", s.peak_device_bytes}});
  // Seconds from the first step's start to each step's end (device synchronised): the loop without the
  // transformer's loading, which the denoise stage includes.
  doc["step_end_seconds"] = step_ends;
  doc["denoise_loop_seconds"] = step_ends.empty() ? 0.0 : step_ends.back();
  write_json_file(o.report_json, doc);
}

// out.png -> out-0.png, out-1.png ... when there are several images, in diffusers' order.
std::string numbered_path(const std::string& path, int64_t index, int64_t count) {
  if (count == 1) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(index) + p.extension().string())).string();
}

void generate_on_this_rank(const GenerateOptions& o) {
  pipeline::GenerateRequest request;
  request.prompts = o.prompts;
  if (!o.prompts_file.empty()) {
    const auto from_file = read_prompts_file(o.prompts_file);
    request.prompts.insert(request.prompts.end(), from_file.begin(), from_file.end());
  }
  DP_CHECK(!request.prompts.empty(), "give at least one --prompt or a --prompts-file");
  request.num_images_per_prompt = o.num_images_per_prompt;
  request.height = o.height;
  request.width = o.width;
  request.steps = o.steps;
  request.guidance = o.guidance;
  request.seed = o.seed;
  request.max_sequence_length = o.max_sequence_length;
  request.dtype = io::parse_run_scalar_type(o.dtype);
  DP_CHECK(o.device == "cpu" || o.device == "cuda", "--device: expected cpu or cuda, got '", o.device, "'");
  request.device = at::Device(o.device == "cuda" ? at::kCUDA : at::kCPU);
  DP_CHECK(o.output_type == "png" || o.output_type == "latent", "--output-type: expected png or latent, got '",
           o.output_type, "'");
  request.validate();
  const bool decode = o.output_type == "png";
  const auto out_dir = std::filesystem::path(o.out).parent_path();
  DP_CHECK(out_dir.empty() || std::filesystem::is_directory(out_dir), "--out: folder ", out_dir.string(),
           " does not exist");
  const auto report_dir = std::filesystem::path(o.report_json).parent_path();
  DP_CHECK(report_dir.empty() || std::filesystem::is_directory(report_dir), "--report-json: folder ",
           report_dir.string(), " does not exist");

  pipeline::FluxPipeline flux(io::ModelFolder::open(o.model));
  flux.check_components(decode);
  const auto grid = flux.resolve_image_size(request);
  DP_INFO("generate: ", request.prompts.size(), " prompt(s) x ", request.num_images_per_prompt, " image(s), ",
          request.width, "x", request.height, ", ", request.steps, " steps, guidance ", request.guidance, ", seed ",
          request.seed, ", ", o.dtype, " on ", o.device);
  const auto started = std::chrono::steady_clock::now();
  std::vector<double> step_ends;
  std::vector<std::string> written;
  runtime::Outputs outputs;
  outputs.on_step = [&step_ends, &request](const pipeline::LoopProgress& p) {
    step_ends.push_back(p.elapsed_seconds);
    const double per_step = p.elapsed_seconds / p.step;
    const double images_per_second = p.elapsed_seconds > 0 ? request.batch() * p.step / (p.steps * p.elapsed_seconds) : 0;
    DP_INFO("step ", p.step, "/", p.steps, ": ", std::fixed, std::setprecision(2), per_step * 1000, " ms/step, ",
            std::setprecision(3), images_per_second, " images/s, ", std::setprecision(2), p.elapsed_seconds,
            " s elapsed, ", per_step * (p.steps - p.step), " s left");
  };
  if (decode) {
    outputs.on_images = [&](const at::Tensor& images) {
      for (int64_t i = 0; i < images.size(0); ++i) {
        const at::Tensor image = images[i].contiguous();
        std::vector<uint8_t> pixels(image.data_ptr<uint8_t>(), image.data_ptr<uint8_t>() + image.numel());
        written.push_back(numbered_path(o.out, i, images.size(0)));
        io::write_png_rgb(written.back(), pixels, static_cast<int>(image.size(1)), static_cast<int>(image.size(0)));
      }
    };
  } else {
    outputs.on_latents = [&](const at::Tensor& latents) {
      const at::Tensor values = latents.to(at::kCPU, at::kFloat).contiguous();
      io::LatentsFile file;
      file.shape = values.sizes().vec();
      file.values.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
      file.numeric_attributes = {{"height", static_cast<double>(request.height)},
                                 {"width", static_cast<double>(request.width)},
                                 {"seed", static_cast<double>(request.seed)},
                                 {"steps", static_cast<double>(request.steps)},
                                 {"guidance", request.guidance},
                                 {"num_images_per_prompt", static_cast<double>(request.num_images_per_prompt)}};
      file.text_attributes = {{"dtype", o.dtype}, {"model", o.model}};
      io::write_latents_hdf5(o.out, file);
      written.push_back(o.out);
    };
  }
  runtime::distributed_generate(flux, request, grid, o.runtime, outputs);
  if (!runtime::World::get().is_coordinator()) return;  // rank 0 reports and writes

  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "timing summary (" << std::fixed << std::setprecision(2) << total << " s total):\n";
  for (const auto& stage : flux.reports()) {
    std::cout << "  " << std::left << std::setw(8) << stage.name << std::right << std::setw(9) << stage.seconds
              << " s   (loading " << std::setw(6) << stage.load_seconds << " s)   peak RSS "
              << human_bytes(stage.peak_resident_bytes);
    if (stage.peak_device_bytes > 0) std::cout << ", peak device " << human_bytes(stage.peak_device_bytes);
    std::cout << "\n";
  }
  for (const auto& path : written) std::cout << "wrote " << path << "\n";
  if (!o.report_json.empty()) {
    write_report_json(o, request, flux.reports(), step_ends, total);
    std::cout << "wrote " << o.report_json << "\n";
  }
}

CommandRegistrar registrar("generate", 10, [](CLI::App& root) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = root.add_subcommand("generate", kGenerateSummary);
  cmd->add_option("--model", o->model, "diffusers FLUX pipeline folder (model_index.json and components)")->required();
  cmd->add_option("--prompt", o->prompts, "a prompt; repeat for several")->take_all();
  cmd->add_option("--prompts-file", o->prompts_file, "file with one prompt a line (blank lines skipped)");
  cmd->add_option("--num-images-per-prompt", o->num_images_per_prompt, "images per prompt")->capture_default_str();
  cmd->add_option("--height", o->height,
                  "image height in pixels (default: from the model, 128 x the VAE's scale factor: 1024 for FLUX.1); "
                  "a multiple of 2 x that factor (16 for FLUX.1), else rounded down with a warning, as diffusers");
  cmd->add_option("--width", o->width, "image width in pixels (default and rounding as --height)");
  cmd->add_option("--steps", o->steps, "denoising steps")->capture_default_str();
  cmd->add_option("--guidance", o->guidance, "guidance scale (used when the transformer has a guidance embedding)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the CPU generator that draws the initial latents")->capture_default_str();
  cmd->add_option("--max-sequence-length", o->max_sequence_length, "T5 tokens, at most 512")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--device", o->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--out", o->out,
                  "output path; several images are written as PATH-0.png, PATH-1.png ... (all images of the first "
                  "prompt first)")
      ->capture_default_str();
  cmd->add_option("--output-type", o->output_type,
                  "png, or latent: packed latents (B, seq, 64) float32 in an HDF5 file, dataset 'latents'")
      ->capture_default_str();
  cmd->add_option("--report-json", o->report_json,
                  "also write per-stage times (with the part spent loading weights), peak memory and step times "
                  "as JSON to this file");
  cmd->add_option("--device-map", o->runtime.device_map,
                  "how the transformer's blocks are split over the ranks (GPU d of the map is rank d): auto, "
                  "balanced, balanced_low_0, sequential, pipeline or a JSON map, as `plan` takes it (default: "
                  "pipeline, the time-balanced split over all ranks)");
  cmd->add_option("--max-memory", o->runtime.max_memory,
                  "memory per device for planning, as `plan` takes it (0=16GB,1=16GB,cpu=64GB or a JSON file)");
  cmd->add_option("--microbatch-size", o->runtime.microbatch_size,
                  "images per microbatch in the denoising ring; with several microbatches every rank is busy "
                  "(latents equal for any world size at the same microbatch size)")
      ->capture_default_str();
  cmd->add_option("--transport-timeout", o->runtime.transport_timeout_seconds,
                  "seconds a rank waits for any one message before it ends the job (a dead or unreachable rank)")
      ->capture_default_str();
  cmd->add_option("--report", o->runtime.report_path,
                  "each rank writes its figures as JSON (rank, blocks, load time, peak memory, bytes to and from "
                  "its neighbours, compute/receive/send/idle seconds in total and per step); with N > 1 ranks "
                  "beside PATH as PATH.rankR.json");
  cmd->callback([o] {
    // MPI starts before anything is checked, so that a bad input on any rank ends every rank with a message.
    const auto& world = runtime::World::init(nullptr, nullptr);
    world.run_guarded([&] { generate_on_this_rank(*o); });
  });
});

}  // namespace
}  // namespace dp::cli
