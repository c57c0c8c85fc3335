// `make-random --pipeline`: the full-size FLUX.1-dev/schnell pipeline folder. The configs are the published
// ones, the parameter counts those of the published architectures (from shape lists, nothing written), and
// the CLI path writes a sparse full-size folder that loads, inspects and plans without gigabytes on disk.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "core/json_file.h"
#include "io/model_folder.h"
#include "io/weight_index.h"
#include "models/clip/clip_text_model.h"
#include "tokenizers/clip_tokenizer.h"
#include "schedulers/flow_match_scheduler.h"
#include "models/flux/flux_config.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/vae.h"
#include "pipeline/flux_pipeline.h"
#include "fixtures/random_pipeline.h"
#include "fixtures/tiny_components.h"
#include "test_support.h"

namespace dp::fixtures {
namespace {

namespace fs = std::filesystem;

TEST(RandomPipeline, FullSizeConfigsAreThePublishedOnes) {
  const auto c = full_size_pipeline_configs(FluxArch::dev);
  // CLIP ViT-L/14 text model (FLUX.1-dev text_encoder/config.json).
  EXPECT_EQ(c.clip.vocab_size, 49408);
  EXPECT_EQ(c.clip.hidden_size, 768);
  EXPECT_EQ(c.clip.intermediate_size, 3072);
  EXPECT_EQ(c.clip.num_hidden_layers, 12);
  EXPECT_EQ(c.clip.num_attention_heads, 12);
  EXPECT_EQ(c.clip.max_position_embeddings, 77);
  EXPECT_EQ(c.clip.hidden_act, "quick_gelu");
  EXPECT_EQ(c.clip.layer_norm_eps, 1e-5);
  EXPECT_EQ(c.clip.eos_token_id, 2);  // the published legacy id
  EXPECT_EQ(clip_text_config_json(c.clip, "bfloat16")["projection_dim"], 768);
  // T5 v1.1 XXL encoder (text_encoder_2/config.json).
  EXPECT_EQ(c.t5.vocab_size, 32128);
  EXPECT_EQ(c.t5.d_model, 4096);
  EXPECT_EQ(c.t5.d_ff, 10240);
  EXPECT_EQ(c.t5.d_kv, 64);
  EXPECT_EQ(c.t5.num_layers, 24);
  EXPECT_EQ(c.t5.num_heads, 64);
  EXPECT_EQ(c.t5.relative_attention_num_buckets, 32);
  EXPECT_EQ(c.t5.relative_attention_max_distance, 128);
  EXPECT_EQ(c.t5.layer_norm_epsilon, 1e-6);
  EXPECT_EQ(c.t5.feed_forward_proj, "gated-gelu");
  EXPECT_EQ(c.t5.dense_act_fn, "gelu_new");
  EXPECT_TRUE(c.t5.is_gated_act);
  // FLUX's AutoencoderKL (vae/config.json).
  EXPECT_EQ(c.vae.in_channels, 3);
  EXPECT_EQ(c.vae.out_channels, 3);
  EXPECT_EQ(c.vae.latent_channels, 16);
  EXPECT_EQ(c.vae.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(c.vae.layers_per_block, 2);
  EXPECT_EQ(c.vae.norm_num_groups, 32);
  EXPECT_EQ(c.vae.sample_size, 1024);
  EXPECT_EQ(c.vae.scaling_factor, 0.3611);
  EXPECT_EQ(c.vae.shift_factor.value_or(0), 0.1159);
  EXPECT_FALSE(c.vae.use_quant_conv);
  EXPECT_FALSE(c.vae.use_post_quant_conv);
  EXPECT_EQ(c.vae.spatial_scale(), 8);
  // The transformer is FluxConfig::flux_dev(); schnell only drops the guidance embedding.
  EXPECT_EQ(c.transformer.to_json(), models::FluxConfig::flux_dev().to_json());
  const auto schnell = full_size_pipeline_configs(FluxArch::schnell);
  EXPECT_FALSE(schnell.transformer.guidance_embeds);
  auto dev_json = c.transformer.to_json(), schnell_json = schnell.transformer.to_json();
  dev_json.erase("guidance_embeds");
  schnell_json.erase("guidance_embeds");
  EXPECT_EQ(dev_json, schnell_json);
  EXPECT_THROW(parse_flux_arch("flux-pro"), std::exception);
}

TEST(RandomPipeline, ConfigDocumentsParseBackToThePresets) {
  const auto c = full_size_pipeline_configs(FluxArch::dev);
  const auto clip = models::ClipTextConfig::from_json(clip_text_config_json(c.clip, "bfloat16"), "clip");
  EXPECT_EQ(clip_text_parameter_shapes(clip).size(), clip_text_parameter_shapes(c.clip).size());
  EXPECT_EQ(clip.hidden_act, c.clip.hidden_act);
  EXPECT_EQ(clip.eos_token_id, c.clip.eos_token_id);
  const auto t5 = models::T5Config::from_json(t5_encoder_config_json(c.t5, "bfloat16"), "t5");
  EXPECT_EQ(t5.d_ff, c.t5.d_ff);
  EXPECT_EQ(t5.num_heads, c.t5.num_heads);
  EXPECT_EQ(t5.dense_act_fn, "gelu_new");
  EXPECT_TRUE(t5.is_gated_act);
  const auto vae = models::VaeConfig::from_json(vae_config_json(c.vae), "vae");
  EXPECT_EQ(vae.block_out_channels, c.vae.block_out_channels);
  EXPECT_EQ(vae.shift_factor, c.vae.shift_factor);
  EXPECT_EQ(vae.sample_size, 1024);
}

// Counts from the shape lists against closed forms of the published architectures, and the published figures.
TEST(RandomPipeline, FullSizeParameterCounts) {
  const auto c = full_size_pipeline_configs(FluxArch::dev);
  {
    const uint64_t d = 768, ff = 3072;
    const uint64_t layer = 2 * 2 * d + 4 * (d * d + d) + (d * ff + ff) + (ff * d + d);
    const uint64_t formula = 49408 * d + 77 * d + 12 * layer + 2 * d;
    EXPECT_EQ(parameter_count(clip_text_parameter_shapes(c.clip)), formula);
    EXPECT_EQ(formula, 123'060'480u);  // CLIPTextModel of clip-vit-large-patch14 (no text projection)
  }
  {
    const uint64_t d = 4096, ff = 10240, inner = 64 * 64;
    const uint64_t block = 4 * d * inner + 3 * d * ff + 2 * d;  // q k v o, wi_0 wi_1 wo, two RMS norms
    const uint64_t formula = 32128 * d + 24 * block + 32 * 64 + d;
    EXPECT_EQ(parameter_count(t5_encoder_parameter_shapes(c.t5)), formula);
    EXPECT_EQ(formula, 4'762'310'656u);  // T5EncoderModel of t5-v1_1-xxl
  }
  {
    // Stable Diffusion's VAE (same blocks, 4 latent channels, quant convs) has 83,653,863 parameters; FLUX's
    // widens encoder.conv_out (512 -> 32) and decoder.conv_in (16 -> 512) and drops both quant convs.
    const uint64_t sd = 83'653'863;
    const uint64_t conv_out = (32 * 512 * 9 + 32) - (8 * 512 * 9 + 8);
    const uint64_t conv_in = (512 * 16 * 9 + 512) - (512 * 4 * 9 + 512);
    const uint64_t quant = (8 * 8 + 8) + (4 * 4 + 4);
    EXPECT_EQ(parameter_count(vae_parameter_shapes(c.vae)), sd + conv_out + conv_in - quant);
    EXPECT_EQ(sd + conv_out + conv_in - quant, 83'819'683u);
  }
  EXPECT_EQ(parameter_count(models::flux_parameter_shapes(c.transformer)), 11'901'408'320u);
  const auto schnell = full_size_pipeline_configs(FluxArch::schnell);
  // Without guidance_embedder: two linears 256->3072 and 3072->3072 with biases.
  EXPECT_EQ(parameter_count(models::flux_parameter_shapes(schnell.transformer)),
            11'901'408'320u - (256 * 3072 + 3072) - (3072 * 3072 + 3072));
}

uint64_t allocated_bytes(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// The CLI writes a sparse full-size folder; our loaders, inspect and plan read it.
TEST(RandomPipeline, CliWritesASparseFullSizePipelineThatInspectsAndPlans) {
  const std::string dir = dp::test::temp_dir("random-pipeline") + "/dev";
  const std::string bin = dp::test::diffpipe_binary();
  auto result = dp::test::run_command(bin + " make-random --pipeline --sparse --arch flux-dev --dtype bf16 --out " +
                                      dir + " 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::printf("%s", result.output.c_str());
  EXPECT_NE(result.output.find("text_encoder_2"), std::string::npos) << result.output;

  const auto folder = io::ModelFolder::open(dir);
  pipeline::FluxPipeline(folder).check_components(true);
  const auto t5_file = fs::path(dir) / "text_encoder_2" / "model.safetensors";
  const uint64_t t5_data = 2 * 4'762'310'656u;  // bf16
  EXPECT_GT(fs::file_size(t5_file), t5_data) << "apparent size holds the header and the data region";
  EXPECT_LT(fs::file_size(t5_file), t5_data + (1u << 20));
  EXPECT_LT(allocated_bytes(t5_file), 64u << 20) << "sparse: the data region is a hole";

  // Configs and keys as our loaders read them; CLIP's token ids are the tiny tokenizer's.
  const auto clip = models::ClipTextConfig::from_json(read_json_file(dir + "/text_encoder/config.json"), "clip");
  const auto tokenizer = tokenizers::ClipTokenizer::from_folder(dir + "/tokenizer");
  const auto ids = tokenizer.encode_padded("a photo of a cat");
  EXPECT_EQ(ids.front(), clip.bos_token_id);
  EXPECT_EQ(clip.eos_token_id, clip.pad_token_id);
  EXPECT_NE(std::find(ids.begin(), ids.end(), clip.eos_token_id), ids.end());
  EXPECT_FALSE(clip.pools_at_largest_id());
  EXPECT_EQ(clip.hidden_size, 768);
  EXPECT_EQ(clip.vocab_size, 49408);
  // The stored keys and shapes against what transformers and diffusers expect: tests/reference/
  // fixture_folders.py (ctest reference.fixture_folders) loads this folder with them.
  // CLIP and the VAE are small enough to load here (zeros from the holes).
  EXPECT_NO_THROW(models::ClipTextModel::load(dir + "/text_encoder", at::kBFloat16, at::kCPU));
  EXPECT_NO_THROW(models::AutoencoderKL::load(dir + "/vae", at::kBFloat16, at::kCPU));
  const auto scheduler = schedulers::FlowMatchSchedulerConfig::from_file(dir + "/scheduler/scheduler_config.json");
  EXPECT_TRUE(scheduler.use_dynamic_shifting);

  // inspect: parameters per component from the headers.
  result = dp::test::run_command(bin + " inspect --json --model " + dir + " 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::map<std::string, uint64_t> parameters;
  const auto inspected = nlohmann::json::parse(result.output);
  for (const auto& c : inspected["components"])
    if (c.contains("parameters")) parameters[c["name"].get<std::string>()] = c["parameters"].get<uint64_t>();
  EXPECT_EQ(parameters["text_encoder"], 123'060'480u);
  EXPECT_EQ(parameters["text_encoder_2"], 4'762'310'656u);
  EXPECT_EQ(parameters["transformer"], 11'901'408'320u);
  EXPECT_EQ(parameters["vae"], 83'819'683u);

  // plan: the transformer "auto" over two H200s (REFERENCE.md's split), the other components "balanced"
  // (placement_test covers the default, which places the transformer too).
  result = dp::test::run_command(bin + " plan --json --model " + dir +
                                 " --device-map auto --pipeline-device-map balanced"
                                 " --components text_encoder,text_encoder_2,vae --max-memory 0=141GB,1=141GB 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto plan = nlohmann::json::parse(result.output);
  ASSERT_TRUE(plan.contains("pipeline_hf_device_map")) << plan.dump(2);
  std::printf("pipeline_hf_device_map: %s\n", plan["pipeline_hf_device_map"].dump().c_str());
  const auto& components = plan["pipeline_hf_device_map"];
  EXPECT_EQ(components.value("text_encoder_2", nlohmann::json()), 0) << components.dump();
  EXPECT_TRUE(components.contains("text_encoder") && components.contains("vae")) << components.dump();
  EXPECT_EQ(plan["hf_device_map"].value("transformer_blocks.17", nlohmann::json()), 1) << plan["hf_device_map"].dump();
}

TEST(RandomPipeline, SchnellFolderHasNoGuidanceAndAStaticShift) {
  const std::string dir = dp::test::temp_dir("random-pipeline") + "/schnell";
  const auto result = dp::test::run_command(dp::test::diffpipe_binary() +
                                            " make-random --pipeline --sparse --arch flux-schnell --out " + dir + " 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto transformer = read_json_file(dir + "/transformer/config.json");
  EXPECT_EQ(transformer["guidance_embeds"], false);
  const auto index = io::WeightIndex::open_dir(dir + "/transformer");
  for (const auto& name : index.names()) EXPECT_EQ(name.find("guidance_embedder"), std::string::npos) << name;
  const auto scheduler = schedulers::FlowMatchSchedulerConfig::from_file(dir + "/scheduler/scheduler_config.json");
  EXPECT_FALSE(scheduler.use_dynamic_shifting);
  EXPECT_EQ(scheduler.shift, 1.0);
  pipeline::FluxPipeline(io::ModelFolder::open(dir)).check_components(true);
}

// The machine-readable stage report bench/pipeline_gpu_generate.py reads, on a make-tiny folder.
TEST(RandomPipeline, GenerateWritesAReportJson) {
  const std::string dir = dp::test::temp_dir("random-pipeline-report");
  const std::string bin = dp::test::diffpipe_binary();
  auto result = dp::test::run_command(bin + " make-tiny --out " + dir + "/tiny 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  result = dp::test::run_command(bin + " generate --model " + dir + "/tiny --prompt 'a cat' --height 64 --width 64 " +
                                 "--steps 3 --dtype fp32 --max-sequence-length 16 --out " + dir + "/img.png " +
                                 "--report-json " + dir + "/report.json 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto report = read_json_file(dir + "/report.json");
  ASSERT_EQ(report["stages"].size(), 3u) << report.dump(2);
  EXPECT_EQ(report["stages"][0]["name"], "encode");
  EXPECT_EQ(report["stages"][2]["name"], "decode");
  for (const auto& stage : report["stages"]) {
    EXPECT_GT(stage["seconds"].get<double>(), 0) << stage.dump();
    EXPECT_GT(stage["peak_resident_bytes"].get<uint64_t>(), 0u) << stage.dump();
    // Every stage loads a component, and loading is part of the stage.
    EXPECT_GT(stage["load_seconds"].get<double>(), 0) << stage.dump();
    EXPECT_LT(stage["load_seconds"].get<double>(), stage["seconds"].get<double>()) << stage.dump();
  }
  ASSERT_EQ(report["step_end_seconds"].size(), 3u);
  EXPECT_EQ(report["denoise_loop_seconds"], report["step_end_seconds"][2]);
  EXPECT_LE(report["denoise_loop_seconds"].get<double>(), report["stages"][1]["seconds"].get<double>());
  EXPECT_EQ(report["steps"], 3);

  result = dp::test::run_command(bin + " generate --model " + dir + "/tiny --prompt x --steps 1 --height 64 " +
                                 "--width 64 --report-json /nonexistent/dir/r.json 2>&1");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("--report-json"), std::string::npos) << result.output;
}

TEST(RandomPipeline, CliRejectsAnUnknownArch) {
  const std::string dir = dp::test::temp_dir("random-pipeline") + "/bad";
  const auto result =
      dp::test::run_command(dp::test::diffpipe_binary() + " make-random --pipeline --arch flux-pro --out " + dir + " 2>&1");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("flux-pro"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace dp::fixtures
