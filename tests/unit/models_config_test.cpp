// Configs read exactly (src/core/json_file, every config parser) and model folders checked against them
// (src/models/component_check): an integer field refuses 2.7, a config must be an object, sizes are checked
// when config.json is read, and each component's safetensors headers hold what its LibTorch loader reads,
// in both checkpoint layouts the loaders accept.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "core/json_file.h"
#include "fixtures/random_model.h"
#include "fixtures/tiny_pipeline.h"
#include "io/model_folder.h"
#include "io/safetensors_writer.h"
#include "models/clip/clip_text_model.h"
#include "models/component_check.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/vae.h"
#include "test_support.h"

namespace dp::models {
namespace {

namespace fs = std::filesystem;

// The message `work` throws (a dp::Error), or "" when it does not throw.
std::string error_of(const std::function<void()>& work) {
  try {
    work();
  } catch (const dp::Error& e) {
    return e.what();
  }
  return "";
}

// Expects `work` to throw a message holding every one of `parts`, and none of nlohmann's own wording.
void expect_error(const std::function<void()>& work, const std::vector<std::string>& parts) {
  const std::string message = error_of(work);
  ASSERT_FALSE(message.empty()) << "no error; expected one with '" << parts.front() << "'";
  for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
}

nlohmann::json parse(const char* text) { return nlohmann::json::parse(text); }

TEST(JsonFields, IntegerFieldsRefuseFractionsBooleansAndOutOfRangeValues) {
  auto flux = [](const char* text) { return [text] { FluxConfig::from_json(parse(text), "t/config.json"); }; };
  expect_error(flux(R"({"num_layers": 2.7})"), {"t/config.json: field 'num_layers' must be an integer, got 2.7"});
  expect_error(flux(R"({"num_layers": 2.0})"), {"field 'num_layers' must be an integer, got 2.0"});
  expect_error(flux(R"({"num_layers": true})"), {"field 'num_layers' must be an integer, got true"});
  expect_error(flux(R"({"num_layers": "19"})"), {"field 'num_layers' must be an integer, got \"19\""});
  expect_error(flux(R"({"patch_size": 18446744073709551615})"), {"field 'patch_size' must be an integer in ["});
  // A 32-bit field (the scheduler's) refuses what only fits in 64 bits.
  expect_error([] { json_get<int>(parse(R"({"steps": 3000000000})"), "steps", "s.json"); },
               {"s.json: field 'steps' must be an integer in [-2147483648, 2147483647], got 3000000000"});
  EXPECT_EQ(json_get<int64_t>(parse(R"({"n": -3000000000})"), "n", "s.json"), -3000000000);
  EXPECT_EQ(json_get<int>(parse(R"({"n": 7})"), "n", "s.json"), 7);
}

TEST(JsonFields, BoolStringNumberAndListFieldsAreExact) {
  auto flux = [](const char* text) { return [text] { FluxConfig::from_json(parse(text), "t/config.json"); }; };
  expect_error(flux(R"({"guidance_embeds": 1})"), {"t/config.json: field 'guidance_embeds' must be true or false, got 1"});
  expect_error(flux(R"({"guidance_embeds": "true"})"), {"field 'guidance_embeds' must be true or false"});
  expect_error(flux(R"({"axes_dims_rope": [16, 56.5, 56]})"), {"field 'axes_dims_rope'[1] must be an integer, got 56.5"});
  expect_error(flux(R"({"axes_dims_rope": "16,56,56"})"), {"field 'axes_dims_rope' must be a list of integers"});
  expect_error([] { ClipTextConfig::from_json(parse(R"({"hidden_act": 5})"), "te/config.json"); },
               {"te/config.json: field 'hidden_act' must be a string, got 5"});
  expect_error([] { VaeConfig::from_json(parse(R"({"up_block_types": ["UpDecoderBlock2D", 2]})"), "v.json"); },
               {"field 'up_block_types'[1] must be a string, got 2"});
  expect_error([] { VaeConfig::from_json(parse(R"({"scaling_factor": true})"), "v.json"); },
               {"field 'scaling_factor' must be a number, got true"});
  expect_error([] { VaeConfig::from_json(parse(R"({"latents_mean": [0.1, null]})"), "v.json"); },
               {"field 'latents_mean'[1] must be a number, got null"});
  // A number field takes an integer, as Python does; null means "the default", as diffusers writes it.
  EXPECT_DOUBLE_EQ(VaeConfig::from_json(parse(R"({"scaling_factor": 1})"), "v.json").scaling_factor, 1.0);
  EXPECT_EQ(FluxConfig::from_json(parse(R"({"out_channels": null})"), "t.json").output_channels(), 64);
  // A long value is shown cut, so one message stays one line.
  const nlohmann::json long_list = {{"hidden_act", std::vector<int>(500, 1)}};
  const std::string message = error_of([&] { ClipTextConfig::from_json(long_list, "c"); });
  EXPECT_LT(message.size(), 200u) << message;
}

TEST(JsonFields, EveryConfigMustBeAnObject) {
  using Parser = std::function<void(const nlohmann::json&)>;
  const std::vector<std::pair<std::string, Parser>> parsers = {
      {"flux", [](const auto& doc) { FluxConfig::from_json(doc, "x/config.json"); }},
      {"clip", [](const auto& doc) { ClipTextConfig::from_json(doc, "x/config.json"); }},
      {"t5", [](const auto& doc) { T5Config::from_json(doc, "x/config.json"); }},
      {"vae", [](const auto& doc) { VaeConfig::from_json(doc, "x/config.json"); }},
      {"scheduler", [](const auto& doc) { schedulers::FlowMatchSchedulerConfig::from_json(doc, "x/config.json"); }},
  };
  for (const auto& [name, parser] : parsers) {
    for (const char* text : {"[]", "[{\"num_layers\": 2}]", "7", "null", "\"config\""}) {
      SCOPED_TRACE(name + " given " + text);
      expect_error([&, text = text] { parser(parse(text)); }, {"x/config.json: expected a JSON object, got "});
    }
  }
  // json_get_or no longer treats a non-object as "every field absent".
  expect_error([] { json_get_or<int>(parse("[1]"), "extra_ids", 100, "tokenizer_config.json"); },
               {"tokenizer_config.json: expected a JSON object, got an array"});
}

TEST(JsonFields, ReadJsonFileNamesTheFileForEveryFailure) {
  const std::string dir = dp::test::temp_dir("json-files");
  const std::string path = dir + "/config.json";
  expect_error([&] { read_json_file(path); }, {path, "cannot open: No such file or directory"});
  expect_error([&] { read_json_file(dir); }, {dir, "is a directory"});
  dp::test::write_file(path, "{\"name\": \"caf\xff\"}");
  expect_error([&] { read_json_file(path); }, {path, "not valid JSON", "UTF-8", "line 1"});
  dp::test::write_file(path, "{\n  \"a\": 1,\n  \"b\": \n}");
  expect_error([&] { read_json_file(path); }, {path, "not valid JSON", "line 4, column 1"});
  dp::test::write_file(path, std::string("\xff\xfe{\0}\0", 6));
  expect_error([&] { read_json_file(path); }, {path, "UTF-16"});
  dp::test::write_file(path, "{\"a\": \"" + std::string(100, 'x') + "\"}");
  expect_error([&] { read_json_file(path, 64); }, {path, "a JSON file here may be at most 64 bytes"});
  EXPECT_EQ(read_json_file(path, 200)["a"].get<std::string>().size(), 100u);
  EXPECT_EQ(kMaxJsonFileBytes, 64u << 20);
}

TEST(ConfigValues, SizesAreCheckedWhenTheConfigIsRead) {
  expect_error([] { FluxConfig::from_json(parse(R"({"num_attention_heads": 0})"), "f.json"); },
               {"f.json: num_attention_heads must be in [1, "});
  expect_error([] { FluxConfig::from_json(parse(R"({"num_layers": 1900000000})"), "f.json"); },
               {"f.json: num_layers must be in [0, 4096], got 1900000000"});
  expect_error([] { FluxConfig::from_json(parse(R"({"axes_dims_rope": [16, -56, 168]})"), "f.json"); },
               {"axes_dims_rope[1] must be positive"});
  expect_error([] { ClipTextConfig::from_json(parse(R"({"num_hidden_layers": -1})"), "c.json"); },
               {"c.json: num_hidden_layers must be in [0, 4096], got -1"});
  expect_error([] { T5Config::from_json(parse(R"({"num_layers": 0})"), "t.json"); }, {"t.json: num_layers must be in [1, "});
  expect_error([] { T5Config::from_json(parse(R"({"num_heads": 65536, "d_kv": 65536})"), "t.json"); },
               {"num_heads x d_kv"});
  expect_error([] { VaeConfig::from_json(parse(R"({"layers_per_block": 0})"), "v.json"); },
               {"v.json: layers_per_block must be in [1, "});
  expect_error([] { VaeConfig::from_json(parse(R"({"block_out_channels": [64, 0]})"), "v.json"); },
               {"block_out_channels[1] must be a positive multiple"});
  expect_error([] { VaeConfig::from_json(parse(R"({"sample_size": []})"), "v.json"); }, {"'sample_size' is an empty list"});
  using schedulers::FlowMatchSchedulerConfig;
  expect_error([] { FlowMatchSchedulerConfig::from_json(parse(R"({"use_dynamic_shifting": true,
      "base_image_seq_len": 256, "max_image_seq_len": 256})"), "s.json"); },
               {"s.json: max_image_seq_len must differ from base_image_seq_len"});
  expect_error([] { FlowMatchSchedulerConfig::from_json(parse(R"({"shift": 0})"), "s.json"); },
               {"s.json: shift must be positive"});
  expect_error([] { FlowMatchSchedulerConfig::from_json(parse(R"({"num_train_timesteps": 1000.5})"), "s.json"); },
               {"field 'num_train_timesteps' must be an integer"});
  expect_error([] { FlowMatchSchedulerConfig::from_json(parse(R"({"use_karras_sigmas": 1})"), "s.json"); },
               {"field 'use_karras_sigmas' must be true or false"});
}

TEST(ModelFolder, IndexAndBareConfigsMustBeObjects) {
  const std::string root = dp::test::temp_dir("model-folder");
  dp::test::write_file(root + "/model_index.json", "[\"FluxPipeline\"]");
  expect_error([&] { io::ModelFolder::open(root); }, {root + "/model_index.json: expected a JSON object, got an array"});
  dp::test::write_file(root + "/model_index.json", R"({"_class_name": "FluxPipeline", ".": ["diffusers", "X"]})");
  expect_error([&] { io::ModelFolder::open(root); }, {"component name '.' is not a plain folder name"});

  const std::string bare = dp::test::temp_dir("bare-component");
  dp::test::write_file(bare + "/config.json", "[1, 2]");
  expect_error([&] { io::ModelFolder::open(bare); }, {bare + "/config.json: expected a JSON object"});
  // transformers names the class in "architectures", diffusers in "_class_name".
  dp::test::write_file(bare + "/config.json", R"({"architectures": ["T5EncoderModel"]})");
  EXPECT_EQ(io::ModelFolder::open(bare).components().front().class_name, "T5EncoderModel");
}

// A tiny pipeline per test binary; tests that damage it work on copies.
const std::string& tiny_folder() {
  static const std::string dir = [] {
    const std::string out = dp::test::temp_dir("component-check") + "/pipe";
    fixtures::write_tiny_pipeline(out, fixtures::TinyPipelineOptions{});
    return out;
  }();
  return dir;
}

std::string tiny_copy(const std::string& tag) {
  const std::string copy = dp::test::temp_dir(tag) + "/pipe";
  fs::copy(tiny_folder(), copy, fs::copy_options::recursive);
  return copy;
}

// Rewrites a safetensors file through `edit`, which may rename a tensor or change its dtype or shape (keeping
// its byte count), or drop it by returning false. The bytes are copied unchanged.
void rewrite_weights(const std::string& file, const std::function<bool(io::TensorInfo&)>& edit) {
  const auto source = io::SafetensorsFile::open(file);
  io::SafetensorsWriter writer;
  std::vector<const io::TensorInfo*> kept;
  for (const auto& info : source->tensors()) {
    io::TensorInfo edited = info;
    if (!edit(edited)) continue;
    writer.add(edited.name, edited.dtype, edited.shape);
    kept.push_back(&info);
  }
  writer.write(file + ".new", [&](std::size_t i, void* out, uint64_t bytes) {
    std::memcpy(out, source->data(*kept[i]), bytes);
  });
  fs::rename(file + ".new", file);
}

std::string problems_text(const std::vector<ComponentProblem>& problems) {
  std::string text;
  for (const auto& p : problems) text += p.component + ": " + p.message + "\n";
  return text;
}

TEST(ComponentCheck, ATinyPipelinePassesInMilliseconds) {
  const auto folder = io::ModelFolder::open(tiny_folder());
  EXPECT_EQ(folder.pipeline_class(), "FluxPipeline");
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(problems_text(check_flux_pipeline(folder, /*decode=*/true)), "");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LT(seconds, 1.0);
  std::printf("check_flux_pipeline on make-tiny's folder: %.1f ms\n", seconds * 1000);
  EXPECT_EQ(problems_text(check_model_folder(folder)), "");
}

// transformers 5 saves CLIPTextModel without the "text_model." wrapper, FLUX.1-dev's checkpoint has it: the
// check accepts exactly what ClipTextModel::load accepts.
TEST(ComponentCheck, ClipAcceptsBothCheckpointLayoutsLikeItsLoader) {
  const std::string dir = tiny_copy("clip-layout") + "/text_encoder";
  rewrite_weights(dir + "/model.safetensors", [](io::TensorInfo& t) {
    t.name = "text_model." + t.name;
    return true;
  });
  EXPECT_NO_THROW(check_clip_text_component(dir));
  EXPECT_NO_THROW(ClipTextModel::load(dir, at::kFloat, at::kCPU));
  // Half prefixed is neither layout: both refuse it, naming the tensor.
  rewrite_weights(dir + "/model.safetensors", [](io::TensorInfo& t) {
    if (t.name.rfind("text_model.final_layer_norm", 0) == 0) t.name = t.name.substr(11);
    return true;
  });
  expect_error([&] { check_clip_text_component(dir); }, {"no tensor 'text_model.final_layer_norm.weight'",
                                                         dir + "/config.json", "(and 1 more tensors disagree)"});
  EXPECT_THROW(ClipTextModel::load(dir, at::kFloat, at::kCPU), dp::Error);
}

// T5's token embedding is tied: save_pretrained keeps "shared.weight", older files only the encoder's name.
TEST(ComponentCheck, T5AcceptsEitherNameOfTheTiedEmbeddingLikeItsLoader) {
  const std::string dir = tiny_copy("t5-embedding") + "/text_encoder_2";
  rewrite_weights(dir + "/model.safetensors", [](io::TensorInfo& t) {
    if (t.name == "shared.weight") t.name = kT5TiedEmbeddingKey;
    return true;
  });
  EXPECT_NO_THROW(check_t5_encoder_component(dir));
  EXPECT_NO_THROW(T5Encoder::load(dir, at::kFloat, at::kCPU));
  rewrite_weights(dir + "/model.safetensors", [](io::TensorInfo& t) { return t.name != kT5TiedEmbeddingKey; });
  expect_error([&] { check_t5_encoder_component(dir); }, {"no tensor 'shared.weight'"});
  EXPECT_THROW(T5Encoder::load(dir, at::kFloat, at::kCPU), dp::Error);
}

// FluxPipeline never encodes an image, and AutoencoderKL::load reads the encoder only when asked.
TEST(ComponentCheck, VaeDecoderOnlyIsEnoughToDecodeLikeItsLoader) {
  const std::string dir = tiny_copy("vae-decoder") + "/vae";
  rewrite_weights(dir + "/diffusion_pytorch_model.safetensors",
                  [](io::TensorInfo& t) { return t.name.rfind("encoder.", 0) != 0; });
  EXPECT_NO_THROW(check_vae_component(dir, VaeParts::decoder));
  EXPECT_NO_THROW(AutoencoderKL::load(dir, at::kFloat, at::kCPU, /*with_encoder=*/false));
  expect_error([&] { check_vae_component(dir, VaeParts::encoder_and_decoder); }, {"no tensor 'encoder.conv_in.weight'"});
  EXPECT_THROW(AutoencoderKL::load(dir, at::kFloat, at::kCPU, /*with_encoder=*/true), dp::Error);
  // The decoder-only list is the whole list less the encoder's tensors.
  const auto config = VaeConfig::from_json(read_json_file(dir + "/config.json"), "vae");
  std::size_t encoder_tensors = 0;
  for (const auto& p : vae_parameter_shapes(config)) encoder_tensors += p.name.rfind("encoder.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(vae_parameter_shapes(config, VaeParts::decoder).size() + encoder_tensors,
            vae_parameter_shapes(config).size());
}

TEST(ComponentCheck, ShapeAndDtypeMismatchesNameTheFileTensorAndShapes) {
  const std::string dir = tiny_copy("flux-shapes") + "/transformer";
  const std::string file = dir + "/diffusion_pytorch_model.safetensors";
  rewrite_weights(file, [](io::TensorInfo& t) {
    if (t.name == "x_embedder.weight") t.shape = {t.shape[1], t.shape[0]};
    if (t.name == "proj_out.bias") t.dtype = io::DType::I32;
    return true;
  });
  expect_error([&] { check_flux_transformer_component(dir); },
               {file + ": tensor 'x_embedder.weight' has shape [64, 32] but " + dir + "/config.json implies [32, 64]",
                "(and 1 more tensors disagree)"});
  rewrite_weights(file, [](io::TensorInfo& t) {
    if (t.name == "x_embedder.weight") t.shape = {t.shape[1], t.shape[0]};
    return true;
  });
  expect_error([&] { check_flux_transformer_component(dir); },
               {file + ": tensor 'proj_out.bias' is stored as I32; weights must be F32, F16, BF16 or F64"});
}

TEST(ComponentCheck, TruncatedWeightsAndMissingConfigsAreFoundFromHeaders) {
  const std::string root = tiny_copy("truncated");
  const std::string file = root + "/transformer/diffusion_pytorch_model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  fs::remove(root + "/vae/config.json");
  const auto problems = check_flux_pipeline(io::ModelFolder::open(root), /*decode=*/true);
  ASSERT_EQ(problems.size(), 2u) << problems_text(problems);
  EXPECT_EQ(problems[0].component, "transformer");
  EXPECT_NE(problems[0].message.find(file), std::string::npos) << problems[0].message;
  EXPECT_EQ(problems[1].component, "vae");
  EXPECT_NE(problems[1].message.find(root + "/vae/config.json: cannot open"), std::string::npos) << problems[1].message;
  // Without decoding the VAE is not read, so only the transformer is a problem; thrown, both are listed.
  EXPECT_EQ(check_flux_pipeline(io::ModelFolder::open(root), /*decode=*/false).size(), 1u);
  expect_error([&] { throw_if_problems(problems, root); },
               {root + ": 2 problems, found before loading any weights:", "\n  transformer: " + file,
                "\n  vae: " + root + "/vae/config.json"});
}

// Components that are each consistent but disagree with each other: today the shape error would come after
// the encode stage (T5) or after the whole denoising loop (the VAE).
TEST(ComponentCheck, ComponentsMustAgreeWithEachOther) {
  const std::string root = tiny_copy("agreement");
  FluxConfig wide = fixtures::tiny_flux_config();
  wide.joint_attention_dim = 48;  // T5's d_model is 32
  wide.out_channels = 16;         // predicts 16 values per token for 64 inputs
  fixtures::RandomComponent transformer = fixtures::flux_transformer_component(wide);
  fixtures::write_random_component(root, transformer, fixtures::RandomWriteOptions{});
  const auto problems = check_flux_pipeline(io::ModelFolder::open(root), /*decode=*/true);
  const std::string text = problems_text(problems);
  ASSERT_EQ(problems.size(), 2u) << text;
  EXPECT_NE(text.find("patch_size^2 x out_channels = 16 values per token but takes in_channels = 64"),
            std::string::npos) << text;
  EXPECT_NE(text.find("joint_attention_dim 48 must equal d_model 32 of " + root + "/text_encoder_2/config.json"),
            std::string::npos) << text;
  EXPECT_EQ(problems_text(check_model_folder(io::ModelFolder::open(root))), text);
  // A bare transformer folder is not a FluxPipeline: FLUX Fill takes more channels than it predicts.
  EXPECT_EQ(problems_text(check_model_folder(io::ModelFolder::open(root + "/transformer"))), "");
}

TEST(ComponentCheck, ClassesOtherThanFluxPipelinesAreRefusedForTheirRole) {
  const std::string root = tiny_copy("classes");
  auto index = read_json_file(root + "/model_index.json");
  index["text_encoder"] = {"transformers", "CLIPTextModelWithProjection"};
  write_json_file(root + "/model_index.json", index);
  expect_error([&] { throw_if_problems(check_flux_pipeline(io::ModelFolder::open(root), true), root); },
               {root + "/model_index.json: component 'text_encoder' is a CLIPTextModelWithProjection but FluxPipeline "
                       "runs a CLIPTextModel there"});
}

}  // namespace
}  // namespace dp::models
