// The whole FLUX pipeline against diffusers' FluxPipeline (tests/reference/cases_pipeline.py): the packed
// latents and the 8-bit images, through the library and through `diffpipe generate`, for VAEs of 4, 2 and 1
// blocks (vae_scale_factor 8, 2, 1), sizes diffusers rounds down and its default size; and the latent layout
// (grid, packing, position ids) on its own.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include <ATen/Parallel.h>
#include <iostream>

#include "core/error.h"
#include "core/json_file.h"
#include "io/hdf5_latents.h"
#include "io/png_image.h"
#include "io/torch_tensors.h"
#include "fixtures/random_model.h"
#include "fixtures/tiny_components.h"
#include "models/flux/flux_fused.h"
#include "pipeline/flux_pipeline.h"
#include "pipeline/flux_stage.h"
#include "pipeline/latent_layout.h"
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
  // null: the pipeline's default size, which resolve_image_size fills in.
  r.height = c.spec["height"].is_null() ? 0 : c.spec["height"].get<int64_t>();
  r.width = c.spec["width"].is_null() ? 0 : c.spec["width"].get<int64_t>();
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

// Every case of cases_pipeline.py: FLUX.1's four-block VAE, and the one- and two-block VAEs of diffusers'
// own tiny pipelines, at multiples of 2 x vae_scale_factor, at sizes diffusers rounds down, and at the
// default size.
const auto kCases = ::testing::Values("dev_like", "schnell_like", "dev_rounded", "vae1_default", "vae1_rounded",
                                      "vae2_like", "vae2_default", "vae2_rounded");

TEST_P(PipelineOracle, LatentsAndImagesMatchDiffusers) {
  const PipelineCase c = load_case(GetParam());
  GenerateRequest request = request_for(c);
  FluxPipeline flux(io::ModelFolder::open(c.dir + "/pipe"));
  flux.check_components(true);
  EXPECT_EQ(flux.vae_scale_factor(), c.spec["vae_scale_factor"].get<int64_t>());
  const auto grid = flux.resolve_image_size(request);
  // The decoded size is diffusers' (rounded down where it warned), and defaults are filled in.
  EXPECT_EQ(grid.image_height(), c.images.size(1));
  EXPECT_EQ(grid.image_width(), c.images.size(2));
  EXPECT_EQ(grid.image_height() != request.height || grid.image_width() != request.width,
            c.spec["size_warned"].get<bool>());
  if (c.spec["height"].is_null()) {
    EXPECT_EQ(request.height, kDefaultSampleSize * c.spec["vae_scale_factor"].get<int64_t>());
  }
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

INSTANTIATE_TEST_SUITE_P(Oracle, PipelineOracle, kCases);

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
  const auto grid = flux.resolve_image_size(request);
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

INSTANTIATE_TEST_SUITE_P(Oracle, PipelineOracleCuda, kCases);

std::string generate_flags(const PipelineCase& c) {
  std::string flags = " --model " + c.dir + "/pipe --dtype fp32";
  for (const auto& p : c.spec["prompts"]) flags += " --prompt '" + p.get<std::string>() + "'";
  flags += " --num-images-per-prompt " + std::to_string(c.spec["num_images_per_prompt"].get<int>());
  if (!c.spec["height"].is_null()) flags += " --height " + std::to_string(c.spec["height"].get<int>());
  if (!c.spec["width"].is_null()) flags += " --width " + std::to_string(c.spec["width"].get<int>());
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
  EXPECT_EQ(png.output.find("rounded down"), std::string::npos) << "64x96 needs no rounding\n" << png.output;
  EXPECT_NE(png.output.find("progress 4/4"), std::string::npos) << png.output;
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
  // diffusers rounds a size that is not a multiple of 16 down (GenerateCommand.RoundsSizesDown...), but a
  // size under 16 leaves no latent patch at all.
  expect_failure(base + " --height 8 --width 32", "height must be at least 16 (2 x vae_scale_factor 8");
  expect_failure(base + " --height 32 --width -16", "--width must be positive");
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

// The default size comes from the folder's VAE: 128 x 1 for a one-block VAE, without --height/--width.
TEST(GenerateCommand, DefaultSizeComesFromTheModelsVae) {
  const PipelineCase c = load_case("vae1_default");
  ASSERT_TRUE(c.spec["height"].is_null() && c.spec["width"].is_null());
  const auto out = dp::test::temp_dir("generate-default-size");
  const auto result = dp::test::run_command(dp::test::diffpipe_binary() + " generate" + generate_flags(c) +
                                            " --output-type latent --out " + out + "/latents.h5");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("128x128"), std::string::npos) << result.output;
  const auto file = io::read_latents_hdf5(out + "/latents.h5");
  ASSERT_EQ(file.shape, c.latents.sizes().vec());
  const at::Tensor values = at::from_blob(const_cast<float*>(file.values.data()), c.latents.sizes(), at::kFloat);
  EXPECT_LE((values - c.latents).abs().max().item<double>() / c.latents.abs().max().item<double>(), 1e-4);
  EXPECT_EQ(file.numeric_attributes.at("height"), 128);
  EXPECT_EQ(file.numeric_attributes.at("width"), 128);

  const auto help = dp::test::run_command(dp::test::diffpipe_binary() + " generate --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("default: from the model"), std::string::npos) << help.output;
  EXPECT_EQ(help.output.find("=1024"), std::string::npos) << "no fixed default size\n" << help.output;
}

// 72x40 with FLUX.1's factor 8: diffusers warns and decodes 64x32; so do we, with exit status 0.
TEST(GenerateCommand, RoundsSizesDownWithDiffusersWarning) {
  const PipelineCase c = load_case("dev_rounded");
  ASSERT_TRUE(c.spec["size_warned"].get<bool>());
  const auto out = dp::test::temp_dir("generate-rounded");
  const auto result = dp::test::run_command(dp::test::diffpipe_binary() + " generate" + generate_flags(c) + " --out " +
                                            out + "/img.png");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("multiples of 16 (2 x vae_scale_factor 8) but are 72 and 40; rounded down to "
                               "height 64, width 32"),
            std::string::npos)
      << result.output;
  int w = 0, h = 0;
  const auto pixels = io::read_png_rgb(out + "/img.png", &w, &h);
  ASSERT_EQ(h, c.images.size(1));
  ASSERT_EQ(w, c.images.size(2));
  const at::Tensor image = at::from_blob(const_cast<uint8_t*>(pixels.data()), {h, w, 3}, at::kByte);
  EXPECT_GE(psnr(image, c.images[0]), 40.0);
}

// A first stage given its schedule (FluxStage::set_schedule) takes each step's modulation rows from the table it
// made, the same bits as the rows computed a step at a time; another step's rows change the output; a schedule whose
// rows pass the budget gets no table; none is made while the table is off; the warm-up leaves the table alone.
TEST(FluxStageSchedule, StepsTakeTheirRowsFromTheTableWithinItsBudget) {
  c10::InferenceMode guard;
  const LatentGrid grid{8, 8, 8};
  FluxStage stage(dp::test::reference_dir() + "/flux/dev_like/transformer", 0, -1, at::kFloat, at::kCPU, grid, 6);
  const auto& config = stage.config();
  const int64_t rows = 2;
  at::manual_seed(7);
  const auto prompts = [&](int64_t microbatch) {
    stage.set_prompts(microbatch, at::randn({rows, 6, config.joint_attention_dim}),
                      at::randn({rows, config.pooled_projection_dim}));
  };
  prompts(0);
  StepSchedule schedule;
  for (const double t : {1.0, 0.5, 0.25}) schedule.timesteps.push_back(at::full({rows}, t));
  if (config.guidance_embeds) schedule.guidance = at::full({rows}, 3.5);
  models::flux::set_modulation_table_override(false);
  EXPECT_FALSE(stage.takes_schedule());
  EXPECT_FALSE(stage.set_schedule(0, schedule)) << "a table while it is off";
  models::flux::set_modulation_table_override(true);
  EXPECT_TRUE(stage.takes_schedule());
  ASSERT_TRUE(stage.set_schedule(0, schedule));
  const at::Tensor latents = at::randn({rows, grid.tokens(), config.in_channels});
  const auto inputs = [&](int step) {
    return std::vector<at::Tensor>{latents, schedule.timesteps[static_cast<size_t>(step)], schedule.guidance};
  };
  const auto relative = [](const at::Tensor& a, const at::Tensor& b) {
    return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
  };
  for (int step = 0; step < 3; ++step) {
    const at::Tensor plain = stage.run(0, inputs(step))[0];
    EXPECT_TRUE(at::equal(stage.run(0, inputs(step), step)[0], plain)) << "step " << step;
  }
  EXPECT_GT(relative(stage.run(0, inputs(0), 2)[0], stage.run(0, inputs(0))[0]), 1e-3)
      << "step 2's rows changed nothing: the table was not read";
  // The warm-up makes a table of its own, of zeros (so that step 1 finds the table's kernel loaded), and leaves the
  // microbatch's alone.
  const at::Tensor before = stage.run(0, inputs(1), 1)[0];
  EXPECT_GE(stage.warm_up(rows, 3), 0.0);
  EXPECT_TRUE(at::equal(stage.run(0, inputs(1), 1)[0], before)) << "the warm-up changed the microbatch's table";
  // Rows beyond the budget: 12 widths of a double block, 3 of a single, per row, step and fp32 value.
  const int64_t widths = 12 * config.num_layers + 3 * (config.num_blocks() - config.num_layers);
  const auto step_bytes = static_cast<uint64_t>(widths * config.inner_dim() * rows * 4);
  const size_t too_many = kModulationTableBudgetBytes / step_bytes + 1;
  const StepSchedule long_schedule{std::vector<at::Tensor>(too_many, at::full({rows}, 0.5)), schedule.guidance};
  prompts(1);
  EXPECT_FALSE(stage.set_schedule(1, long_schedule));
  EXPECT_EQ(stage.run(1, inputs(0), 0)[0].size(0), rows) << "a step without a table runs as before";
  models::flux::set_modulation_table_override(std::nullopt);
}

TEST(LatentLayout, GridFollowsTheVaeScaleFactorAndRoundsDownAsDiffusers) {
  struct Expected {
    int64_t height, width, factor, latent_height, latent_width;
  };
  // prepare_latents: 2 * (H // (2 * factor)).
  for (const auto& e : std::vector<Expected>{{1024, 1024, 8, 128, 128}, {64, 96, 8, 8, 12},  {72, 40, 8, 8, 4},
                                             {40, 72, 2, 20, 36},       {30, 58, 2, 14, 28}, {37, 50, 1, 36, 50},
                                             {2, 2, 1, 2, 2},           {48, 64, 4, 12, 16}}) {
    SCOPED_TRACE(std::to_string(e.height) + "x" + std::to_string(e.width) + " factor " + std::to_string(e.factor));
    const LatentGrid grid = latent_grid(e.height, e.width, e.factor);
    EXPECT_EQ(grid.height, e.latent_height);
    EXPECT_EQ(grid.width, e.latent_width);
    EXPECT_EQ(grid.vae_scale_factor, e.factor);
    EXPECT_EQ(grid.tokens(), (e.latent_height / 2) * (e.latent_width / 2));
    EXPECT_EQ(grid.image_height(), e.height / (2 * e.factor) * 2 * e.factor);
    EXPECT_EQ(grid.image_width(), e.width / (2 * e.factor) * 2 * e.factor);
  }
  EXPECT_EQ(default_image_size(8), 1024);
  EXPECT_EQ(default_image_size(2), 256);
  EXPECT_EQ(default_image_size(1), 128);
  auto expect_error = [](const std::function<void()>& call, const std::string& message) {
    try {
      call();
      ADD_FAILURE() << "expected an error containing: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  expect_error([] { latent_grid(8, 64, 8); }, "height must be at least 16 (2 x vae_scale_factor 8");
  expect_error([] { latent_grid(64, 3, 2); }, "width must be at least 4 (2 x vae_scale_factor 2");
  expect_error([] { latent_grid(0, 64, 1); }, "height must be at least 2");
  expect_error([] { latent_grid(64, 64, 0); }, "vae_scale_factor must be at least 1");
}

TEST(LatentLayout, PackingAndIdsMatchFluxPipelineOnAnOddGrid) {
  // A 6x10 latent grid (factor 1, 6x10 image): 3x5 tokens of 2x2 patches.
  const LatentGrid grid = latent_grid(6, 10, 1);
  const at::Tensor latents = at::arange(2 * 3 * 6 * 10, at::kFloat).reshape({2, 3, 6, 10});
  const at::Tensor packed = pack_latents(latents);
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{2, 15, 12}));
  // Token (row 1, column 2), channel 1, patch offset (1, 0): latents[b, 1, 2 * 1 + 1, 2 * 2 + 0].
  EXPECT_EQ(packed[1][1 * 5 + 2][1 * 4 + 1 * 2 + 0].item<float>(), latents[1][1][3][4].item<float>());
  EXPECT_TRUE(at::equal(unpack_latents(packed, grid), latents));
  const at::Tensor ids = latent_image_ids(grid);
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{15, 3}));
  EXPECT_EQ(ids[7][0].item<float>(), 0);
  EXPECT_EQ(ids[7][1].item<float>(), 1);  // token 7 = row 1, column 2
  EXPECT_EQ(ids[7][2].item<float>(), 2);
}

// Without a VAE in model_index.json, FluxPipeline uses 8; a listed VAE without config.json is an error
// that names the file, found before any work.
TEST(LatentLayout, VaeScaleFactorComesFromTheFolder) {
  const auto dir = dp::test::temp_dir("vae-scale-factor");
  std::filesystem::create_directories(dir + "/transformer");
  dp::test::write_file(dir + "/transformer/config.json", "{}");
  dp::test::write_file(dir + "/model_index.json",
                       R"({"transformer": ["diffusers", "FluxTransformer2DModel"], "vae": [null, null]})");
  FluxPipeline without_vae(io::ModelFolder::open(dir));
  EXPECT_EQ(without_vae.vae_scale_factor(), 8);
  GenerateRequest request;
  EXPECT_EQ(without_vae.resolve_image_size(request).height, 128);
  EXPECT_EQ(request.height, 1024);
  EXPECT_EQ(request.width, 1024);

  std::filesystem::create_directories(dir + "/vae");
  dp::test::write_file(dir + "/model_index.json",
                       R"({"transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]})");
  FluxPipeline no_config(io::ModelFolder::open(dir));
  try {
    no_config.vae_scale_factor();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vae/config.json"), std::string::npos) << e.what();
  }
  dp::test::write_file(dir + "/vae/config.json",
                       R"({"block_out_channels": [8, 16, 16], "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
                           "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"], "norm_num_groups": 4})");
  FluxPipeline three_blocks(io::ModelFolder::open(dir));
  EXPECT_EQ(three_blocks.vae_scale_factor(), 4);
  GenerateRequest sized;
  sized.width = 100;
  const LatentGrid grid = three_blocks.resolve_image_size(sized);
  EXPECT_EQ(sized.height, 512);
  EXPECT_EQ(sized.width, 100);
  EXPECT_EQ(grid.height, 128);
  EXPECT_EQ(grid.width, 24);
}

// A PNG's bytes must not depend on the thread count, the world size or how images were grouped into
// microbatches (a resumed run regroups them): decode_with decodes image by image with a fixed CPU thread
// count. The VAE is wide enough (64-128 channels, 16 latent channels through post_quant_conv) for oneDNN to
// choose kernels by thread count and batch size; with a plain batched decode at the caller's threads, 1 and 3
// threads differ by ~1.5e-5 before rounding and hundreds of pixels come out one apart.
TEST(Decode, PixelsDoNotDependOnThreadsOrGrouping) {
  models::VaeConfig config;
  config.block_out_channels = {64, 128, 128};
  config.down_block_types.assign(3, "DownEncoderBlock2D");
  config.up_block_types.assign(3, "UpDecoderBlock2D");
  config.layers_per_block = 2;
  config.latent_channels = 16;
  config.scaling_factor = 0.41;
  config.shift_factor = 0.07;
  const std::string root = dp::test::temp_dir("decode_threads");
  fixtures::RandomComponent vae_component{"vae", "config.json", fixtures::vae_config_json(config),
                                          models::vae_parameter_shapes(config, models::VaeParts::decoder),
                                          "diffusion_pytorch_model"};
  fixtures::RandomWriteOptions write;
  write.seed = 7;
  fixtures::write_random_component(root, vae_component, write);
  const auto vae = models::AutoencoderKL::load(root + "/vae", at::kFloat, at::kCPU);
  const LatentGrid grid = latent_grid(160, 128, config.spatial_scale());
  const at::Tensor latents =
      at::randn({3, grid.tokens(), 4 * config.latent_channels}, at::TensorOptions().dtype(at::kFloat));

  const int callers_threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor one_thread = FluxPipeline::decode_with(vae, grid, latents);
  EXPECT_EQ(at::get_num_threads(), 1) << "decode_with puts the caller's thread count back";
  at::set_num_threads(3);
  const at::Tensor three_threads = FluxPipeline::decode_with(vae, grid, latents);
  const at::Tensor first_alone = FluxPipeline::decode_with(vae, grid, latents.narrow(0, 0, 1));
  const at::Tensor last_two = FluxPipeline::decode_with(vae, grid, latents.narrow(0, 1, 2));
  at::set_num_threads(callers_threads);

  ASSERT_EQ(one_thread.sizes(), (at::IntArrayRef{3, 160, 128, 3}));
  EXPECT_EQ(one_thread.ne(three_threads).sum().item<int64_t>(), 0) << "pixels differ between 1 and 3 threads";
  EXPECT_EQ(at::cat({first_alone, last_two}).ne(three_threads).sum().item<int64_t>(), 0)
      << "pixels differ between one batch of 3 and batches of 1 and 2";
}

}  // namespace
}  // namespace dp::pipeline
