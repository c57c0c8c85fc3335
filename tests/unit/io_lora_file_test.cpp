// LoRA adapter files: the three layouts map onto diffusers' modules as diffusers 0.42.1 maps them (the kohya
// and BFL splits of fused projections, alpha folded as powers of two, PEFT's alpha rules), the model fit
// refuses what the model does not have, and every malformed file is one clear error naming the file and key,
// within a second. The fuzz corpus (tests/fuzz/corpus/lora_file) is classified here: bad_* rejected, valid_*
// accepted.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/lora_file.h"
#include "io/safetensors.h"
#include "models/lora_check.h"
#include "test_support.h"

namespace dp::io {
namespace {

// A safetensors image built in memory: F32 tensors (BF16 ones from their float values).
class Image {
 public:
  Image& add(const std::string& name, std::vector<int64_t> shape, float fill = 0.5f, const char* dtype = "F32") {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const bool bf16 = std::strcmp(dtype, "BF16") == 0;
    const size_t begin = data_.size();
    for (int64_t i = 0; i < n; ++i) {
      float v = fill;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      if (bf16) {
        const uint16_t half = static_cast<uint16_t>(bits >> 16);
        data_.append(reinterpret_cast<const char*>(&half), 2);
      } else {
        data_.append(reinterpret_cast<const char*>(&bits), 4);
      }
    }
    header_[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, data_.size()}}};
    return *this;
  }
  Image& pair(const std::string& module, const std::string& down, const std::string& up, int64_t rank, int64_t in,
              int64_t out) {
    add(module + down, {rank, in});
    return add(module + up, {out, rank});
  }
  Image& metadata(const std::string& key, const std::string& value) {
    header_["__metadata__"][key] = value;
    return *this;
  }
  std::string bytes() const {
    const std::string json = header_.dump();
    std::string out(8, '\0');
    const uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + json + data_;
  }

 private:
  nlohmann::json header_ = nlohmann::json::object();
  std::string data_;
};

LoraFile parse(const Image& image) { return parse_lora_image(image.bytes(), "adapter.safetensors"); }

std::string error_of(const Image& image) {
  try {
    parse(image);
  } catch (const dp::Error& e) {
    return e.what();
  }
  return "";
}

const LoraModule& module_named(const LoraFile& f, const std::string& name) {
  for (const auto& m : f.modules)
    if (m.module == name) return m;
  throw std::runtime_error("no module " + name);
}

// A tiny FLUX: inner dim 32, 2 double and 2 single blocks.
models::FluxConfig tiny_flux() {
  models::FluxConfig c;
  c.num_layers = 2;
  c.num_single_layers = 2;
  c.num_attention_heads = 2;
  c.attention_head_dim = 16;
  c.axes_dims_rope = {4, 6, 6};
  c.in_channels = 16;
  c.joint_attention_dim = 32;
  c.pooled_projection_dim = 32;
  return c;
}

models::ClipTextConfig tiny_clip() {
  models::ClipTextConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 37;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  return c;
}

TEST(LoraFile, DiffusersLayoutTakesPeftAlphaRules) {
  Image image;
  const std::string p = "transformer.";
  image.pair(p + "transformer_blocks.0.attn.to_q", ".lora_A.weight", ".lora_B.weight", 4, 32, 32)
      .add(p + "transformer_blocks.0.attn.to_q.alpha", {}, 3.0f)
      .pair(p + "transformer_blocks.0.attn.to_v", ".lora_A.weight", ".lora_B.weight", 4, 32, 32)
      .add(p + "transformer_blocks.0.attn.to_v.alpha", {}, 5.0f, "BF16")
      .pair(p + "single_transformer_blocks.0.attn.to_q", ".lora_A.weight", ".lora_B.weight", 2, 32, 32)
      .pair(p + "proj_out", ".lora_A.weight", ".lora_B.weight", 4, 32, 16)
      .add(p + "proj_out.alpha", {}, 7.0f)
      .pair("text_encoder.text_model.encoder.layers.1.mlp.fc1", ".lora_A.weight", ".lora_B.weight", 2, 32, 37);
  LoraFile f = parse(image);
  EXPECT_EQ(f.layout, LoraLayout::diffusers);
  ASSERT_EQ(f.modules.size(), 5u);
  // The first alpha in key order (proj_out's 7) is PEFT's lora_alpha; the others differ and are patterns.
  const auto& q = module_named(f, "transformer_blocks.0.attn.to_q");
  EXPECT_EQ(q.alpha.value, 3.0);
  EXPECT_FLOAT_EQ(lora_scaling(q.alpha, q.rank, 0.7), 0.525f);
  const auto& v = module_named(f, "transformer_blocks.0.attn.to_v");
  EXPECT_EQ(lora_scaling(v.alpha, v.rank, 0.7), 0.875);  // bf16 arithmetic, as PEFT does with a bf16 alpha
  const auto& single_q = module_named(f, "single_transformer_blocks.0.attn.to_q");
  EXPECT_EQ(single_q.alpha.value, 7.0);  // no alpha of its own: the default (pattern to_q needs a '.' before it)
  EXPECT_FLOAT_EQ(lora_scaling(single_q.alpha, 2, 0.7), 2.45f);
  const auto& fc1 = module_named(f, "encoder.layers.1.mlp.fc1");  // "text_model." dropped, as transformers 5 has it
  EXPECT_EQ(fc1.component, LoraComponent::text_encoder);
  EXPECT_TRUE(fc1.alpha.equals_rank);
  EXPECT_EQ(lora_scaling(fc1.alpha, 2, 1.3), 1.3);

  const auto flux = tiny_flux();
  const auto clip = tiny_clip();
  models::fit_lora_to_model(f, flux, &clip);
  EXPECT_EQ(module_named(f, "single_transformer_blocks.0.attn.to_q").block, 2);
  EXPECT_EQ(module_named(f, "proj_out").block, -1);
}

TEST(LoraFile, KohyaSplitsFusedProjectionsAndFoldsAlpha) {
  Image image;
  image.pair("lora_unet_double_blocks_1_img_attn_qkv", ".lora_down.weight", ".lora_up.weight", 16, 32, 96)
      .add("lora_unet_double_blocks_1_img_attn_qkv.alpha", {}, 1.0f)
      .pair("lora_unet_single_blocks_0_linear1", ".lora_down.weight", ".lora_up.weight", 4, 32, 96 + 128)
      .add("lora_unet_single_blocks_0_linear1.alpha", {}, 2.0f)
      .pair("lora_unet_double_blocks_0_txt_mod_lin", ".lora_down.weight", ".lora_up.weight", 4, 32, 192)
      .pair("lora_unet_img_in", ".lora_down.weight", ".lora_up.weight", 4, 16, 32)
      .pair("lora_te1_text_model_encoder_layers_0_self_attn_out_proj", ".lora_down.weight", ".lora_up.weight", 8, 32, 32)
      .add("lora_te1_text_model_encoder_layers_0_self_attn_out_proj.alpha", {}, 4.0f);
  LoraFile f = parse(image);
  EXPECT_EQ(f.layout, LoraLayout::kohya);
  ASSERT_EQ(f.modules.size(), 3u + 4u + 1u + 1u);
  const auto& k = module_named(f, "transformer_blocks.1.attn.to_k");
  EXPECT_EQ(k.part, 1);
  EXPECT_EQ(k.parts, 3);
  // alpha 1 / rank 16 = 1/16: scale_down 1/4, scale_up 1/4.
  EXPECT_EQ(k.down_multiplier, 0.25);
  EXPECT_EQ(k.up_multiplier, 0.25);
  EXPECT_TRUE(k.alpha.equals_rank);
  const auto& mlp = module_named(f, "single_transformer_blocks.0.proj_mlp");
  EXPECT_EQ(mlp.down_multiplier, 0.5);
  EXPECT_EQ(mlp.up_multiplier, 1.0);
  EXPECT_EQ(module_named(f, "transformer_blocks.0.norm1_context.linear").down_multiplier, 1.0);  // no alpha: rank
  const auto& out_proj = module_named(f, "encoder.layers.0.self_attn.out_proj");
  EXPECT_EQ(out_proj.component, LoraComponent::text_encoder);
  EXPECT_EQ(out_proj.down_multiplier, 0.5);
  // The embedder is what diffusers 0.42.1 converts outside "transformer." and never loads.
  ASSERT_EQ(f.ignored.size(), 1u);
  EXPECT_NE(f.ignored[0].find("lora_unet_img_in"), std::string::npos);

  const auto flux = tiny_flux();
  const auto clip = tiny_clip();
  models::fit_lora_to_model(f, flux, &clip);
  EXPECT_EQ(module_named(f, "transformer_blocks.1.attn.to_v").row_offset, 64);
  EXPECT_EQ(module_named(f, "single_transformer_blocks.0.proj_mlp").row_offset, 96);
  EXPECT_EQ(module_named(f, "single_transformer_blocks.0.proj_mlp").out_features, 128);
  EXPECT_EQ(module_named(f, "single_transformer_blocks.0.attn.to_q").block, 2);
}

TEST(LoraFile, BflNamesConvertAsComfyUiWritesThem) {
  Image image;
  image.pair("diffusion_model.double_blocks.0.img_attn.qkv", ".lora_down.weight", ".lora_up.weight", 4, 32, 96)
      .add("diffusion_model.double_blocks.0.img_attn.qkv.alpha", {}, 8.0f, "BF16")
      .pair("diffusion_model.single_blocks.1.linear2", ".lora_down.weight", ".lora_up.weight", 4, 160, 32)
      .pair("text_encoders.clip_l.transformer.text_model.encoder.layers.1.self_attn.q_proj", ".lora_down.weight",
            ".lora_up.weight", 4, 32, 32);
  LoraFile f = parse(image);
  EXPECT_EQ(f.layout, LoraLayout::bfl);
  EXPECT_EQ(module_named(f, "transformer_blocks.0.attn.to_v").part, 2);
  EXPECT_EQ(module_named(f, "transformer_blocks.0.attn.to_q").down_multiplier, 2.0);  // alpha 8 / rank 4
  EXPECT_EQ(module_named(f, "single_transformer_blocks.1.proj_out").rank, 4);
  EXPECT_EQ(module_named(f, "encoder.layers.1.self_attn.q_proj").component, LoraComponent::text_encoder);
  const auto flux = tiny_flux();
  const auto clip = tiny_clip();
  models::fit_lora_to_model(f, flux, &clip);
}

TEST(LoraFile, MetadataConfigGivesRankAndAlpha) {
  Image image;
  image.pair("transformer.transformer_blocks.0.ff.net.2", ".lora_A.weight", ".lora_B.weight", 4, 128, 32)
      .pair("transformer.transformer_blocks.1.ff.net.2", ".lora_A.weight", ".lora_B.weight", 2, 128, 32)
      .metadata("lora_adapter_metadata", R"({"transformer.r": 4, "transformer.lora_alpha": 8,
        "transformer.rank_pattern": {"^transformer_blocks.1.ff.net.2": 2}, "transformer.alpha_pattern": {"transformer_blocks.1.ff.net.2": 1}})");
  const LoraFile f = parse(image);
  EXPECT_EQ(lora_scaling(module_named(f, "transformer_blocks.0.ff.net.2").alpha, 4, 1.0), 2.0);
  EXPECT_EQ(lora_scaling(module_named(f, "transformer_blocks.1.ff.net.2").alpha, 2, 1.0), 0.5);
}

struct BadCase {
  const char* name;
  Image image;
  const char* expected;  // part of the message
};

TEST(LoraFile, MalformedFilesAreOneClearError) {
  const std::string te = "transformer.transformer_blocks.0.attn.to_q";
  std::vector<BadCase> cases;
  cases.push_back({"empty", Image(), "holds no tensors"});
  cases.push_back({"another model", Image().pair("lora_unet_down_blocks_0_attentions_0_proj_in", ".lora_down.weight",
                                                 ".lora_up.weight", 4, 32, 32),
                   "another model"});
  cases.push_back({"unknown keys", Image().add("model.layers.0.weight", {2, 2}), "names no module"});
  cases.push_back({"missing up", Image().add(te + ".lora_A.weight", {4, 32}), "no matching lora_B"});
  cases.push_back({"rank mismatch", Image().add(te + ".lora_A.weight", {4, 32}).add(te + ".lora_B.weight", {32, 3}),
                   "rank mismatch"});
  cases.push_back({"nan alpha", Image().pair(te, ".lora_A.weight", ".lora_B.weight", 4, 32, 32).add(te + ".alpha", {}, NAN),
                   "must be finite"});
  cases.push_back({"3-D factor", Image().add(te + ".lora_A.weight", {4, 32, 1}).add(te + ".lora_B.weight", {32, 4}),
                   "2-D"});
  cases.push_back({"BFL with lora_A", Image().pair("diffusion_model.double_blocks.0.img_attn.qkv", ".lora_A.weight",
                                                   ".lora_B.weight", 4, 32, 96),
                   "loads no weights"});
  cases.push_back({"same module twice",
                   Image()
                       .pair("lora_unet_double_blocks_0_img_attn_proj", ".lora_down.weight", ".lora_up.weight", 4, 32, 32)
                       .pair("diffusion_model.double_blocks.0.img_attn.proj", ".lora_down.weight", ".lora_up.weight", 4,
                             32, 32),
                   "both become"});
  cases.push_back({"alpha and metadata",
                   Image().pair(te, ".lora_A.weight", ".lora_B.weight", 4, 32, 32).add(te + ".alpha", {}, 4.0f)
                       .metadata("lora_adapter_metadata", R"({"transformer.r": 4})"),
                   "both alpha keys and lora_adapter_metadata"});
  for (const auto& c : cases) {
    const auto started = std::chrono::steady_clock::now();
    const std::string message = error_of(c.image);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find("adapter.safetensors"), std::string::npos) << c.name << ": " << message;
    EXPECT_LT(seconds, 1.0) << c.name;
  }
  // Truncated: the header claims more data than the file has.
  std::string truncated = Image().pair(te, ".lora_A.weight", ".lora_B.weight", 4, 32, 32).bytes();
  truncated.resize(truncated.size() - 10);
  EXPECT_THROW(parse_lora_image(truncated, "adapter.safetensors"), dp::Error);
}

std::string fit_error(Image image, bool with_clip = true) {
  try {
    LoraFile f = parse(image);
    const auto clip = tiny_clip();
    models::fit_lora_to_model(f, tiny_flux(), with_clip ? &clip : nullptr);
  } catch (const dp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(LoraFile, ModelFitRefusesWhatTheModelDoesNotHave) {
  const std::string p = "transformer.";
  EXPECT_NE(fit_error(Image().pair(p + "transformer_blocks.5.attn.to_q", ".lora_A.weight", ".lora_B.weight", 4, 32, 32))
                .find("2 double and 2 single blocks"),
            std::string::npos);
  EXPECT_NE(fit_error(Image().pair(p + "transformer_blocks.0.attn.to_q", ".lora_A.weight", ".lora_B.weight", 4, 64, 64))
                .find("[32, 32] in this model"),
            std::string::npos);
  EXPECT_NE(fit_error(Image().pair(p + "transformer_blocks.0.attn.norm_q", ".lora_A.weight", ".lora_B.weight", 4, 16, 16))
                .find("does not have as a Linear"),
            std::string::npos);
  EXPECT_NE(fit_error(Image().pair("lora_unet_single_blocks_0_linear1", ".lora_down.weight", ".lora_up.weight", 4, 32, 96))
                .find("3 x 32 + 128"),
            std::string::npos);
  EXPECT_NE(fit_error(Image().pair("text_encoder.encoder.layers.0.mlp.fc2", ".lora_A.weight", ".lora_B.weight", 4, 37, 32),
                      false)
                .find("no text_encoder"),
            std::string::npos);
}

TEST(LoraFile, FiniteCheckNamesTheKey) {
  const std::string dir = test::temp_dir("lora-nan");
  const std::string path = dir + "/nan.safetensors";
  Image image;
  image.add("transformer.proj_out.lora_A.weight", {4, 32}).add("transformer.proj_out.lora_B.weight", {16, 4}, NAN);
  test::write_file(path, image.bytes());
  const LoraFile f = read_lora_file(path);  // the header is fine: values are read only for the blocks a rank loads
  const auto mapped = SafetensorsFile::open(path);
  try {
    check_lora_finite(*mapped, {&f.modules[0]});
    FAIL() << "a NaN factor was accepted";
  } catch (const dp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.proj_out.lora_B.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
  }
}

TEST(LoraSpecs, ParseNamesScalesAndLimits) {
  auto s = parse_lora_spec("loras/style.v2.safetensors:0.7");
  EXPECT_EQ(s.path, "loras/style.v2.safetensors");
  EXPECT_EQ(s.scale, 0.7);
  EXPECT_EQ(s.name, "style_v2");
  s = parse_lora_spec("detail=/data/x.safetensors");
  EXPECT_EQ(s.name, "detail");
  EXPECT_EQ(s.path, "/data/x.safetensors");
  EXPECT_EQ(s.scale, 1.0);
  EXPECT_THROW(parse_lora_spec("x.safetensors:inf"), dp::Error);
  EXPECT_THROW(check_lora_specs({parse_lora_spec("a=x:1"), parse_lora_spec("a=y:1")}), dp::Error);

  const auto started = std::chrono::steady_clock::now();
  std::vector<LoraSpec> many(10000, parse_lora_spec("a.safetensors"));
  try {
    check_lora_specs(many);
    FAIL() << "10000 adapters were accepted";
  } catch (const dp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("10000 LoRA adapters"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 1.0);
}

TEST(LoraFile, PatternsMatchAsPeftDoes) {
  EXPECT_TRUE(lora_pattern_matches("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_q"));
  EXPECT_FALSE(lora_pattern_matches("transformer_blocks.0.attn.to_q", "single_transformer_blocks.0.attn.to_q"));
  EXPECT_TRUE(lora_pattern_matches("proj_out", "single_transformer_blocks.3.proj_out"));
  EXPECT_FALSE(lora_pattern_matches("^proj_out", "single_transformer_blocks.3.proj_out"));
  EXPECT_TRUE(lora_pattern_matches("^proj_out", "proj_out"));
}

// The fuzz corpus: every bad_* input must be refused, every valid_* one parsed and fitted to the harness's model.
TEST(LoraFile, FuzzCorpusIsClassified) {
  const std::string dir = test::source_dir() + "/tests/fuzz/corpus/lora_file";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  int valid = 0, bad = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const std::string bytes = test::read_file(entry.path().string());
    std::string message;
    try {
      LoraFile f = parse_lora_image(bytes, name);
      const auto clip = tiny_clip();
      models::fit_lora_to_model(f, tiny_flux(), &clip);
    } catch (const dp::Error& e) {
      message = e.what();
    }
    if (name.rfind("bad_", 0) == 0) {
      EXPECT_FALSE(message.empty()) << name << " was accepted";
      ++bad;
    } else if (name.rfind("valid_", 0) == 0) {
      EXPECT_TRUE(message.empty()) << name << ": " << message;
      ++valid;
    }
  }
  EXPECT_GE(valid, 3);
  EXPECT_GE(bad, 8);
}

}  // namespace
}  // namespace dp::io
