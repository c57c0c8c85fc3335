// The whole FLUX pipeline against diffusers' FluxPipeline (tests/reference/cases_pipeline.py): the packed
// latents and the 8-bit images, through the library and through `diffpipe generate`.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>

#include "core/json_file.h"
#include "io/hdf5_latents.h"
#include "io/png_image.h"
#include "io/torch_tensors.h"
#include "pipeline/flux_pipeline.h"
#include "test_support.h"

namespace dp::pipeline {
namespace {

struct PipelineCase {
  std::string dir;
  nlohmann::json spec;
  at::Tensor latents, images;
};

PipelineCase load_case(const std::string& name) {
  PipelineCase c;
  c.dir = dp::test::reference_dir() + "/pipeline/" + name;
  c.spec = read_json_file(c.dir + "/case.json");
  auto file = io::SafetensorsFile::open(c.dir + "/expected.safetensors");
  c.latents = io::tensor_view(file, file->at("latents")).clone();
  c.images = io::tensor_view(file, file->at("images")).clone();
  return c;
}

GenerateRequest request_for(const PipelineCase& c) {
  GenerateRequest r;
  r.prompts = c.spec["prompts"].get<std::vector<std::string>>();
  r.num_images_per_prompt = c.spec["num_images_per_prompt"].get<int>();
  r.height = c.spec["height"].get<int64_t>();
  r.width = c.spec["width"].get<int64_t>();
  r.steps = c.spec["steps"].get<int>();
  r.guidance = c.spec["guidance_scale"].get<double>();
  r.seed = c.spec["seed"].get<uint64_t>();
  r.max_sequence_length = c.spec["max_sequence_length"].get<int>();
  r.dtype = at::kFloat;
  return r;
}

double psnr(const at::Tensor& a, const at::Tensor& b) {
  const double mse = (a.to(at::kDouble) - b.to(at::kDouble)).pow(2).mean().item<double>();
  return mse == 0 ? INFINITY : 10 * std::log10(255.0 * 255.0 / mse);
}

class PipelineOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineOracle, LatentsAndImagesMatchDiffusers) {
  const PipelineCase c = load_case(GetParam());
  const GenerateRequest request = request_for(c);
  FluxPipeline flux(io::ModelFolder::open(c.dir + "/pipe"));
  flux.check_components(true);
  const auto grid = latent_grid(request.height, request.width);
  const auto prompts = flux.encode_prompts(request);
  at::Tensor latents = flux.initial_latents(request, grid);
  int steps_seen = 0;
  latents = flux.denoise(request, grid, prompts, latents, [&](const StepProgress&) { ++steps_seen; });
  EXPECT_EQ(steps_seen, request.steps);
  ASSERT_EQ(latents.sizes(), c.latents.sizes());
  const double scale = c.latents.abs().max().item<double>();
  const double err = (latents - c.latents).abs().max().item<double>() / scale;
  std::cout << GetParam() << ": packed latents relative error " << err << "\n";
  // fp32 CPU through four models and several steps: rounding differences stay near 1e-6.
  EXPECT_LE(err, 1e-4);
  const at::Tensor images = flux.decode(request, grid, latents);
  ASSERT_EQ(images.sizes(), c.images.sizes());
  const double db = psnr(images, c.images);
  std::cout << GetParam() << ": image PSNR " << db << " dB\n";
  EXPECT_GE(db, 40.0);
  ASSERT_EQ(flux.reports().size(), 3u);
  for (const auto& stage : flux.reports()) {
    EXPECT_GT(stage.peak_resident_bytes, 0u) << stage.name;
    EXPECT_GT(stage.load_seconds, 0) << stage.name;
    EXPECT_LT(stage.load_seconds, stage.seconds) << stage.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Oracle, PipelineOracle, ::testing::Values("dev_like", "schnell_like"));

// The whole pipeline on the GPU in fp32 against the same CPU oracle. Every stage starts its timer before
// its first CUDA allocation, so this also covers the peak-memory counters on a fresh device.
class PipelineOracleCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { DP_TEST_NEED_CUDA(); }
};

TEST_P(PipelineOracleCuda, Fp32LatentsAndImagesMatchDiffusersCpu) {
  const PipelineCase c = load_case(GetParam());
  GenerateRequest request = request_for(c);
  request.device = at::Device(at::kCUDA);
  FluxPipeline flux(io::ModelFolder::open(c.dir + "/pipe"));
  const auto grid = latent_grid(request.height, request.width);
  const auto prompts = flux.encode_prompts(request);
  const at::Tensor latents = flux.denoise(request, grid, prompts, flux.initial_latents(request, grid), {});
  const at::Tensor cpu_latents = latents.cpu();
  const double err =
      (cpu_latents - c.latents).abs().max().item<double>() / c.latents.abs().max().item<double>();
  std::cout << GetParam() << ": CUDA fp32 packed latents relative error vs diffusers CPU " << err << "\n";
  // TF32 stays off, so only the kernels' reduction order differs from the CPU: the CPU test's 1e-4.
  EXPECT_LE(err, 1e-4);
  const double db = psnr(flux.decode(request, grid, latents), c.images);
  std::cout << GetParam() << ": CUDA image PSNR vs diffusers CPU " << db << " dB\n";
  EXPECT_GE(db, 40.0);
  ASSERT_EQ(flux.reports().size(), 3u);
  for (const auto& stage : flux.reports()) EXPECT_GT(stage.peak_device_bytes, 0u) << stage.name;
}

INSTANTIATE_TEST_SUITE_P(Oracle, PipelineOracleCuda, ::testing::Values("dev_like", "schnell_like"));

std::string generate_flags(const PipelineCase& c) {
  std::string flags = " --model " + c.dir + "/pipe --dtype fp32";
  for (const auto& p : c.spec["prompts"]) flags += " --prompt '" + p.get<std::string>() + "'";
  flags += " --num-images-per-prompt " + std::to_string(c.spec["num_images_per_prompt"].get<int>());
  flags += " --height " + std::to_string(c.spec["height"].get<int>());
  flags += " --width " + std::to_string(c.spec["width"].get<int>());
  flags += " --steps " + std::to_string(c.spec["steps"].get<int>());
  flags += " --guidance " + std::to_string(c.spec["guidance_scale"].get<double>());
  flags += " --seed " + std::to_string(c.spec["seed"].get<int>());
  flags += " --max-sequence-length " + std::to_string(c.spec["max_sequence_length"].get<int>());
  return flags;
}

TEST(GenerateCommand, WritesPngsInDiffusersOrderAndLatentsToHdf5) {
  const PipelineCase c = load_case("dev_like");
  const auto out = dp::test::temp_dir("generate");
  const auto png = dp::test::run_command(dp::test::diffpipe_binary() + " generate" + generate_flags(c) + " --out " +
                                         out + "/img.png");
  ASSERT_EQ(png.exit_code, 0) << png.output;
  EXPECT_NE(png.output.find("timing summary"), std::string::npos) << png.output;
  EXPECT_NE(png.output.find("step 4/4"), std::string::npos) << png.output;
  for (int64_t i = 0; i < c.images.size(0); ++i) {
    int w = 0, h = 0;
    const auto pixels = io::read_png_rgb(out + "/img-" + std::to_string(i) + ".png", &w, &h);
    const at::Tensor image = at::from_blob(const_cast<uint8_t*>(pixels.data()), {h, w, 3}, at::kByte);
    EXPECT_GE(psnr(image, c.images[i]), 40.0) << "image " << i;
  }
  const auto latent = dp::test::run_command(dp::test::diffpipe_binary() + " generate" + generate_flags(c) +
                                            " --output-type latent --out " + out + "/latents.h5");
  ASSERT_EQ(latent.exit_code, 0) << latent.output;
  const auto file = io::read_latents_hdf5(out + "/latents.h5");
  EXPECT_EQ(file.shape, c.latents.sizes().vec());
  const at::Tensor values = at::from_blob(const_cast<float*>(file.values.data()), c.latents.sizes(), at::kFloat);
  EXPECT_LE((values - c.latents).abs().max().item<double>() / c.latents.abs().max().item<double>(), 1e-4);
  for (const char* key : {"height", "width", "seed", "steps", "guidance"})
    EXPECT_EQ(file.numeric_attributes.count(key), 1u) << key;
  EXPECT_EQ(file.numeric_attributes.at("height"), c.spec["height"].get<double>());
  EXPECT_EQ(file.numeric_attributes.at("seed"), c.spec["seed"].get<double>());
}

TEST(GenerateCommand, BadInputsFailClearly) {
  const PipelineCase c = load_case("schnell_like");
  const auto tmp = dp::test::temp_dir("generate-bad");
  const std::string bin = dp::test::diffpipe_binary() + " generate ";
  auto expect_failure = [&](const std::string& args, const std::string& message) {
    const auto result = dp::test::run_command(bin + args);
    EXPECT_NE(result.exit_code, 0) << args;
    EXPECT_NE(result.output.find(message), std::string::npos) << args << "\n" << result.output;
  };
  const std::string small = " --height 32 --width 32";
  const std::string base = "--model " + c.dir + "/pipe --prompt cat --steps 1 --out " + tmp + "/x.png";
  expect_failure(base + " --height 100 --width 32", "multiple of 16, got 100");
  expect_failure(base + small + " --dtype fp8", "--dtype 'fp8' is not a run dtype");
  dp::test::write_file(tmp + "/empty.txt", "\n  \n");
  expect_failure("--model " + c.dir + "/pipe --prompts-file " + tmp + "/empty.txt", "has no prompt");
  expect_failure("--model " + c.dir + "/pipe", "at least one --prompt");
  // A copy of the pipeline with a component folder and a tokenizer file missing.
  const auto broken = tmp + "/pipe";
  std::filesystem::copy(c.dir + "/pipe", broken, std::filesystem::copy_options::recursive);
  dp::test::remove_tree(broken + "/vae");
  expect_failure("--model " + broken + " --prompt cat --steps 1 --out " + tmp + "/y.png" + small, "vae");
  std::filesystem::copy(c.dir + "/pipe/vae", broken + "/vae", std::filesystem::copy_options::recursive);
  // Every vocabulary file of the CLIP tokenizer gone (save_pretrained may have written vocab.json +
  // merges.txt or tokenizer.json): the error must name the tokenizer folder.
  for (const char* file : {"vocab.json", "merges.txt", "tokenizer.json"}) std::filesystem::remove(broken + "/tokenizer/" + file);
  expect_failure("--model " + broken + " --prompt cat --steps 1 --out " + tmp + "/z.png" + small, "tokenizer");
  expect_failure("--model " + tmp + "/nowhere --prompt cat", "does not exist");
}

}  // namespace
}  // namespace dp::pipeline
