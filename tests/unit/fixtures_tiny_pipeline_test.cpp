// `make-tiny`'s pipeline folder: every file is there, every component loads with our loaders, and
// pipeline::FluxPipeline runs on it end to end. That diffusers and transformers load it (every stored key
// and shape the one their classes expect) is checked by tests/reference/fixture_folders.py (ctest
// reference.fixture_folders), not here: a comparison with our own parameter lists, which the writer uses,
// cannot fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/json_file.h"
#include "io/weight_index.h"
#include "models/clip/clip_text_model.h"
#include "tokenizers/clip_tokenizer.h"
#include "models/flux/flux_transformer.h"
#include "models/t5/t5_encoder.h"
#include "tokenizers/t5_tokenizer.h"
#include "models/vae/vae.h"
#include "pipeline/flux_pipeline.h"
#include "fixtures/tiny_components.h"
#include "fixtures/tiny_pipeline.h"
#include "test_support.h"

namespace dp::fixtures {
namespace {

namespace fs = std::filesystem;

// One folder for the whole test binary: writing it takes a fraction of a second, but every test reads it.
const std::string& tiny_folder() {
  static const std::string dir = [] {
    const std::string out = dp::test::temp_dir("tiny") + "/pipe";
    write_tiny_pipeline(out, TinyPipelineOptions{});
    return out;
  }();
  return dir;
}

std::set<std::string> stored_keys(const std::string& component_dir) {
  const auto index = io::WeightIndex::open_dir(component_dir);
  return {index.names().begin(), index.names().end()};
}

TEST(TinyPipeline, WritesEveryFileOfAPipelineFolder) {
  const std::string dir = tiny_folder();
  for (const char* file : {"model_index.json", "scheduler/scheduler_config.json", "tokenizer/vocab.json",
                           "tokenizer/merges.txt", "tokenizer/tokenizer_config.json",
                           "tokenizer/special_tokens_map.json", "tokenizer_2/tokenizer.json",
                           "tokenizer_2/tokenizer_config.json", "text_encoder/config.json",
                           "text_encoder/model.safetensors", "text_encoder_2/config.json",
                           "text_encoder_2/model.safetensors", "transformer/config.json",
                           "transformer/diffusion_pytorch_model.safetensors", "vae/config.json",
                           "vae/diffusion_pytorch_model.safetensors"}) {
    EXPECT_TRUE(fs::exists(dir + "/" + file)) << file;
  }
  const auto index = read_json_file(dir + "/model_index.json");
  EXPECT_EQ(index["tokenizer_2"], nlohmann::json({"transformers", "T5Tokenizer"}));
  EXPECT_TRUE(index["image_encoder"][0].is_null());
  const auto folder = io::ModelFolder::open(dir);
  pipeline::FluxPipeline(folder).check_components(true);
}

TEST(TinyPipeline, KeyCountsAreThoseTransformersAndDiffusersSave) {
  const std::string dir = tiny_folder();
  // Key counts of the same architectures saved by transformers 5.23 / diffusers 0.42.1 (the pipeline oracle's
  // tiny models): CLIP 36, T5 21 (shared.weight only), VAE 176 (encoder and decoder, no quant convs).
  EXPECT_EQ(stored_keys(dir + "/text_encoder").size(), 36u);
  EXPECT_EQ(stored_keys(dir + "/text_encoder_2").size(), 21u);
  EXPECT_EQ(stored_keys(dir + "/vae").size(), 176u);

  // With quant convolutions and a shortcut-free first level the list follows the config.
  const auto vae = models::VaeConfig::from_json(read_json_file(dir + "/vae/config.json"), "vae");
  const auto t5 = models::T5Config::from_json(read_json_file(dir + "/text_encoder_2/config.json"), "t5");
  models::VaeConfig sd = vae;
  sd.use_quant_conv = sd.use_post_quant_conv = true;
  EXPECT_EQ(vae_parameter_shapes(sd).size(), 180u);
  models::T5Config plain = t5;
  plain.is_gated_act = false;
  EXPECT_EQ(t5_encoder_parameter_shapes(plain).size(), 19u);
}

TEST(TinyPipeline, ConfigsParseAndAgreeWithTheTokenizers) {
  const std::string dir = tiny_folder();
  const auto clip_tokenizer = tokenizers::ClipTokenizer::from_folder(dir + "/tokenizer");
  const auto t5_tokenizer = tokenizers::T5Tokenizer::from_folder(dir + "/tokenizer_2");
  const auto clip = models::ClipTextConfig::from_json(read_json_file(dir + "/text_encoder/config.json"), "clip");
  const auto t5 = models::T5Config::from_json(read_json_file(dir + "/text_encoder_2/config.json"), "t5");
  EXPECT_EQ(clip.vocab_size, clip_tokenizer.vocab_size());
  EXPECT_EQ(clip.eos_token_id, clip_tokenizer.eos_id());
  EXPECT_EQ(clip.bos_token_id, clip_tokenizer.bos_id());
  EXPECT_EQ(clip_tokenizer.pad_id(), clip_tokenizer.eos_id());
  EXPECT_EQ(t5.vocab_size, t5_tokenizer.vocab_size());
  EXPECT_TRUE(t5.is_gated_act);
  EXPECT_EQ(t5.dense_act_fn, "gelu_new");
  const auto flux = models::FluxConfig::from_json(read_json_file(dir + "/transformer/config.json"), "flux");
  EXPECT_EQ(flux.joint_attention_dim, t5.d_model);
  EXPECT_EQ(flux.pooled_projection_dim, clip.hidden_size);
  const auto vae = models::VaeConfig::from_json(read_json_file(dir + "/vae/config.json"), "vae");
  EXPECT_EQ(vae.spatial_scale(), 8);
  EXPECT_EQ(vae.latent_channels * 4, flux.in_channels);

  // Common words are single tokens; anything else still encodes (bytes for CLIP, characters or <unk> for T5).
  const auto clip_ids = clip_tokenizer.encode("a cat");
  ASSERT_GE(clip_ids.size(), 4u);
  EXPECT_EQ(clip_ids.front(), clip_tokenizer.bos_id());
  EXPECT_EQ(clip_ids.back(), clip_tokenizer.eos_id());
  EXPECT_EQ(clip_tokenizer.decode(clip_tokenizer.encode("A cat, sipping a Margarita!")), "<|startoftext|>a cat , sipping a margarita ! <|endoftext|>");
  const auto t5_ids = t5_tokenizer.encode("a cat");
  EXPECT_EQ(t5_ids.size(), 3u);  // "▁a", "▁cat", "</s>"
  EXPECT_EQ(t5_ids.back(), t5_tokenizer.eos_id());
  EXPECT_EQ(t5_tokenizer.decode(t5_tokenizer.encode("Zebra 42 in Palm Springs")), "Zebra 42 in Palm Springs</s>");
  for (int64_t id : t5_tokenizer.encode("☃ unseen")) EXPECT_LT(id, t5.vocab_size);
}

TEST(TinyPipeline, EveryModelLoads) {
  const std::string dir = tiny_folder();
  const auto clip = models::ClipTextModel::load(dir + "/text_encoder", at::kFloat, at::kCPU);
  const auto t5 = models::T5Encoder::load(dir + "/text_encoder_2", at::kFloat, at::kCPU);
  const auto vae = models::AutoencoderKL::load(dir + "/vae", at::kFloat, at::kCPU, /*with_encoder=*/true);
  const auto flux = models::FluxTransformer::load(dir + "/transformer", at::kFloat, at::kCPU);
  const at::Tensor ids = at::tensor(std::vector<int64_t>{clip.config().bos_token_id, 5, clip.config().eos_token_id}).unsqueeze(0);
  EXPECT_EQ(clip.forward(ids).pooled_output.sizes(), (std::vector<int64_t>{1, 32}));
  EXPECT_EQ(t5.forward(at::tensor(std::vector<int64_t>{4, 5, 1}).unsqueeze(0)).sizes(), (std::vector<int64_t>{1, 3, 32}));
  const auto posterior = vae.encode(at::rand({1, 3, 32, 32}) * 2 - 1);
  EXPECT_EQ(posterior.mean.sizes(), (std::vector<int64_t>{1, 16, 4, 4}));
  EXPECT_EQ(flux.config().num_blocks(), 6);
}

TEST(TinyPipeline, GeneratesANonConstantImage) {
  pipeline::FluxPipeline flux(io::ModelFolder::open(tiny_folder()));
  flux.check_components(true);
  pipeline::GenerateRequest request;
  request.prompts = {"a cat sipping a margarita in a pool in Palm Springs"};
  request.height = request.width = 64;
  request.steps = 2;
  request.max_sequence_length = 32;
  request.dtype = at::kFloat;
  request.validate();
  const auto grid = flux.resolve_image_size(request);
  const auto prompts = flux.encode_prompts(request);
  at::Tensor latents = flux.initial_latents(request, grid);
  latents = flux.denoise(request, grid, prompts, latents, {});
  EXPECT_TRUE(latents.isfinite().all().item<bool>());
  const at::Tensor image = flux.decode(request, grid, latents);
  ASSERT_EQ(image.sizes(), (std::vector<int64_t>{1, 64, 64, 3}));
  const at::Tensor pixels = image.to(at::kFloat);
  EXPECT_GT(pixels.std().item<double>(), 5.0) << "the tiny pipeline's image is (nearly) constant";
  EXPECT_GT(std::get<0>(at::_unique(image.flatten())).numel(), 32);
}

TEST(TinyPipeline, StoresTheRequestedDtype) {
  const std::string out = dp::test::temp_dir("tiny-bf16") + "/pipe";
  TinyPipelineOptions options;
  options.dtype = io::DType::BF16;
  options.seed = 3;
  write_tiny_pipeline(out, options);
  EXPECT_EQ(read_json_file(out + "/text_encoder/config.json")["dtype"], "bfloat16");
  const auto t5 = models::T5Encoder::load(out + "/text_encoder_2", at::kBFloat16, at::kCPU);
  EXPECT_EQ(t5.dtype(), at::kBFloat16);
}

}  // namespace
}  // namespace dp::fixtures
