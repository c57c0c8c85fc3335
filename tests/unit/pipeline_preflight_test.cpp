// `diffpipe generate` refuses a damaged model folder before any compute: FluxPipeline::check_components reads
// every config and every safetensors header first. Each case damages a copy of make-tiny's folder and expects
// a non-zero exit within seconds, no "stage encode" log line (nothing was encoded), no output file, and a
// message naming the file and the field or tensor. `diffpipe inspect` reports the same problems.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/json_file.h"
#include "fixtures/random_model.h"
#include "test_support.h"

namespace dp::pipeline {
namespace {

namespace fs = std::filesystem;

// make-tiny's folder, written once per test binary through the CLI.
const std::string& tiny_folder() {
  static const std::string dir = [] {
    const std::string out = dp::test::temp_dir("preflight") + "/pipe";
    const auto made = dp::test::run_command(dp::test::diffpipe_binary() + " make-tiny --out " + out);
    EXPECT_EQ(made.exit_code, 0) << made.output;
    return out;
  }();
  return dir;
}

void edit_json(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json doc = read_json_file(path);
  edit(doc);
  dp::test::write_file(path, doc.dump(2));
}

void truncate_by(const std::string& path, uintmax_t bytes) { fs::resize_file(path, fs::file_size(path) - bytes); }

// Reverses one tensor's shape in a safetensors header, in place: the byte count stays right, so only a check
// of the shape against the config can notice.
void reverse_stored_shape(const std::string& path, const std::string& tensor) {
  std::string bytes = dp::test::read_file(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);  // little-endian, as the format and this host are
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_size));
  auto& shape = header.at(tensor).at("shape");
  std::reverse(shape.begin(), shape.end());
  std::string text = header.dump();
  ASSERT_LE(text.size(), header_size);
  text.resize(header_size, ' ');  // the format allows trailing spaces
  bytes.replace(8, header_size, text);
  dp::test::write_file(path, bytes);
}

struct Damage {
  std::string name;
  std::function<void(const std::string& dir)> apply;
  std::vector<std::string> expected;  // in the error message, with DIR standing for the damaged folder
};

std::vector<Damage> damages() {
  const std::string weights = "/diffusion_pytorch_model.safetensors";
  return {
      {"an integer field given 2.7",
       [](const std::string& d) { edit_json(d + "/transformer/config.json", [](auto& c) { c["num_layers"] = 2.7; }); },
       {"DIR/transformer/config.json: field 'num_layers' must be an integer, got 2.7"}},
      {"a config that is a JSON array",
       [](const std::string& d) { dp::test::write_file(d + "/transformer/config.json", "[{\"num_layers\": 2}]"); },
       {"DIR/transformer/config.json: expected a JSON object, got an array"}},
      {"a bool field given 1",
       [](const std::string& d) {
         edit_json(d + "/transformer/config.json", [](auto& c) { c["guidance_embeds"] = 1; });
       },
       {"DIR/transformer/config.json: field 'guidance_embeds' must be true or false, got 1"}},
      {"a truncated transformer file", [weights](const std::string& d) { truncate_by(d + "/transformer" + weights, 1000); },
       {"DIR/transformer" + weights}},
      {"a transformer tensor with the wrong shape",
       [weights](const std::string& d) { reverse_stored_shape(d + "/transformer" + weights, "x_embedder.weight"); },
       {"DIR/transformer" + weights + ": tensor 'x_embedder.weight' has shape [64, 32] but "
        "DIR/transformer/config.json implies [32, 64]"}},
      {"a missing vae/config.json", [](const std::string& d) { fs::remove(d + "/vae/config.json"); },
       {"DIR/vae/config.json: cannot open"}},
      {"truncated VAE weights", [weights](const std::string& d) { truncate_by(d + "/vae" + weights, 1000); },
       {"DIR/vae" + weights}},
      {"a CLIP config with a head count that does not divide",
       [](const std::string& d) {
         edit_json(d + "/text_encoder/config.json", [](auto& c) { c["num_attention_heads"] = 5; });
       },
       {"DIR/text_encoder/config.json: hidden_size 32 is not a multiple of num_attention_heads 5"}},
      {"a scheduler config with a fractional integer",
       [](const std::string& d) {
         edit_json(d + "/scheduler/scheduler_config.json", [](auto& c) { c["num_train_timesteps"] = 1000.5; });
       },
       {"DIR/scheduler/scheduler_config.json: field 'num_train_timesteps' must be an integer, got 1000.5"}},
      {"a transformer that disagrees with T5",
       [](const std::string& d) {
         models::FluxConfig wide = fixtures::tiny_flux_config();
         wide.joint_attention_dim = 48;
         fixtures::write_random_component(d, fixtures::flux_transformer_component(wide), fixtures::RandomWriteOptions{});
       },
       {"DIR/transformer/config.json: joint_attention_dim 48 must equal d_model 32 of DIR/text_encoder_2/config.json"}},
  };
}

std::string with_dir(std::string text, const std::string& dir) {
  for (auto at = text.find("DIR"); at != std::string::npos; at = text.find("DIR", at + dir.size())) text.replace(at, 3, dir);
  return text;
}

std::string damaged_copy(const Damage& damage) {
  const std::string dir = dp::test::temp_dir("preflight-case") + "/pipe";
  fs::copy(tiny_folder(), dir, fs::copy_options::recursive);
  damage.apply(dir);
  return dir;
}

TEST(Preflight, GenerateRefusesADamagedFolderBeforeEncoding) {
  for (const Damage& damage : damages()) {
    SCOPED_TRACE(damage.name);
    const std::string dir = damaged_copy(damage);
    const std::string out = dir + "/../out.png";
    const auto started = std::chrono::steady_clock::now();
    const auto result = dp::test::run_command(dp::test::diffpipe_binary() + " generate --model " + dir +
                                              " --prompt cat --steps 2 --height 32 --width 32 --dtype fp32 --out " + out);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::printf("%-52s exit %d after %.2f s\n", damage.name.c_str(), result.exit_code, seconds);
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_EQ(result.output.find("stage encode"), std::string::npos) << "the encode stage ran:\n" << result.output;
    EXPECT_FALSE(fs::exists(out));
    for (const auto& part : damage.expected) {
      EXPECT_NE(result.output.find(with_dir(part, dir)), std::string::npos) << with_dir(part, dir) << "\n" << result.output;
    }
    EXPECT_EQ(result.output.find("json.exception"), std::string::npos) << result.output;
    // Starting the LibTorch half takes most of this; a loaded CI machine gets slack.
    EXPECT_LT(seconds, 10.0);
  }
}

TEST(Preflight, InspectReportsTheSameProblems) {
  const std::string bin = dp::test::diffpipe_binary();
  const auto healthy = dp::test::run_command(bin + " inspect --model " + tiny_folder());
  EXPECT_EQ(healthy.exit_code, 0) << healthy.output;
  EXPECT_EQ(healthy.output.find("problem"), std::string::npos) << healthy.output;
  for (const Damage& damage : damages()) {
    SCOPED_TRACE(damage.name);
    const std::string dir = damaged_copy(damage);
    const auto result = dp::test::run_command(bin + " inspect --model " + dir);
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("  problem: "), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("1 problem found (listed above)"), std::string::npos) << result.output;
    for (const auto& part : damage.expected) {
      EXPECT_NE(result.output.find(with_dir(part, dir)), std::string::npos) << with_dir(part, dir) << "\n" << result.output;
    }
    // The JSON report lists the problem under its component and still summarises the weights that parse.
    // Grouped, so that run_command's own 2>&1 does not bring the error line into the JSON.
    const auto as_json = dp::test::run_command("(" + bin + " inspect --json --model " + dir + " 2>/dev/null)");
    EXPECT_NE(as_json.exit_code, 0);
    const auto report = nlohmann::json::parse(as_json.output, nullptr, /*allow_exceptions=*/false);
    if (report.is_discarded()) {
      ADD_FAILURE() << "not one JSON document:\n" << as_json.output;
      continue;
    }
    EXPECT_EQ(report["problems"], 1);
    std::size_t listed = 0;
    for (const auto& c : report["components"]) {
      listed += c["problems"].size();
      if (c["name"] == "text_encoder_2") {
        EXPECT_TRUE(c.contains("parameters")) << c.dump();
      }
    }
    EXPECT_EQ(listed, 1u) << report.dump(2);
  }
}

// Latents need no VAE weights: broken ones do not stop `--output-type latent`.
TEST(Preflight, LatentOutputDoesNotReadTheVaeWeights) {
  const Damage broken_vae = damages()[6];
  ASSERT_EQ(broken_vae.name, "truncated VAE weights");
  const std::string dir = damaged_copy(broken_vae);
  const std::string out = dir + "/../latents.h5";
  const auto result = dp::test::run_command(dp::test::diffpipe_binary() + " generate --model " + dir +
                                            " --prompt cat --steps 1 --height 32 --width 32 --dtype fp32"
                                            " --output-type latent --out " + out);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(fs::exists(out));
}

}  // namespace
}  // namespace dp::pipeline
