// generate --config: a run config's keys become flags ahead of the command line's, which override them; an
// unknown key or a wrong type fails naming the key and the file. Tested on a CLI11 command with one option of
// each kind generate has, so that it needs neither LibTorch nor a model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli/run_config.h"
#include "core/error.h"

namespace dp::cli {
namespace {

namespace fs = std::filesystem;

struct Options {
  std::string model, device_map = "pipeline", config;
  std::vector<std::string> prompts, lora;
  std::vector<double> sigmas;
  int steps = 28, ranks = 0;
  int64_t height = 0;
  double guidance = 3.5;
  uint64_t seed = 0;
  bool verbose = false;
};

// A command shaped like generate: text, repeatable text, int, int64, double, uint64 and a boolean flag.
struct Command {
  CLI::App app{"test"};
  CLI::App* cmd = nullptr;
  Options o;
  Command() {
    cmd = app.add_subcommand("generate");
    cmd->add_option("--config", o.config);
    cmd->add_option("--model", o.model)->required();
    cmd->add_option("--prompt", o.prompts)->allow_extra_args(false);
    cmd->add_option("--steps", o.steps);
    cmd->add_option("--ranks", o.ranks);
    cmd->add_option("--height", o.height);
    cmd->add_option("--guidance", o.guidance);
    cmd->add_option("--seed", o.seed);
    cmd->add_option("--device-map", o.device_map);
    cmd->add_flag("--verbose", o.verbose);
    cmd->add_option("--lora", o.lora);
    cmd->add_option("--sigmas", o.sigmas)->delimiter(',');
  }
  // Expands and parses `args` (after the command name) as main does.
  void parse(const std::vector<std::string>& args) {
    auto words = expand_run_config(*cmd, args);
    words.insert(words.begin(), "generate");
    std::reverse(words.begin(), words.end());
    app.parse(words);
  }
};

class RunConfigTest : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / ("dp_run_config_" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) {
    const auto path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  }
  // The message of the dp::Error that expanding `args` throws ("" when none is thrown).
  std::string error_of(const std::vector<std::string>& args) {
    Command c;
    try {
      expand_run_config(*c.cmd, args);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(RunConfigTest, KeysBecomeFlagsOfEveryKind) {
  const auto path = write("all.json", R"({"description": "for the docs", "model": "/m", "prompt": ["a cat", "-dash"],
    "steps": 50, "height": 768, "guidance": 3.5, "seed": 18446744073709551615, "device-map": "auto",
    "verbose": true, "ranks": 2})");
  Command c;
  c.parse({"--config", path});
  EXPECT_EQ(c.o.model, "/m");
  EXPECT_EQ(c.o.prompts, (std::vector<std::string>{"a cat", "-dash"}));  // a leading dash stays a value
  EXPECT_EQ(c.o.steps, 50);
  EXPECT_EQ(c.o.height, 768);
  EXPECT_DOUBLE_EQ(c.o.guidance, 3.5);
  EXPECT_EQ(c.o.seed, UINT64_MAX);
  EXPECT_EQ(c.o.device_map, "auto");
  EXPECT_TRUE(c.o.verbose);
  EXPECT_EQ(c.o.ranks, 2);
  EXPECT_EQ(c.o.config, path);  // kept, so that messages can name the file
}

TEST_F(RunConfigTest, TheCommandLineOverridesTheFileWholeListsIncluded) {
  const auto path = write("c.json", R"({"model": "/m", "prompt": ["a", "b"], "steps": 50, "guidance": 3.5})");
  Command c;
  c.parse({"--steps", "4", "--config=" + path, "--prompt", "c", "--guidance=1.25"});
  EXPECT_EQ(c.o.steps, 4);
  EXPECT_EQ(c.o.prompts, std::vector<std::string>{"c"});
  EXPECT_DOUBLE_EQ(c.o.guidance, 1.25);
  EXPECT_EQ(c.o.model, "/m");
}

TEST_F(RunConfigTest, LoraAdaptersAreObjectsAndSigmasAList) {
  const auto path = write("lora.json", R"({"model": "/m", "lora": [{"path": "a.safetensors", "scale": 0.7,
    "name": "style"}, {"path": "b.safetensors"}, "c.safetensors:1.3"], "sigmas": [1.0, 0.5, 0.25]})");
  Command c;
  c.parse({"--config", path});
  EXPECT_EQ(c.o.lora, (std::vector<std::string>{"style=a.safetensors:0.7", "b.safetensors", "c.safetensors:1.3"}));
  EXPECT_EQ(c.o.sigmas, (std::vector<double>{1.0, 0.5, 0.25}));
  const auto bad = write("bad.json", R"({"model": "/m", "lora": [{"file": "a.safetensors"}]})");
  const std::string message = error_of({"--config", bad});
  EXPECT_NE(message.find("unknown field 'file'"), std::string::npos) << message;
  EXPECT_NE(message.find("bad.json: key 'lora' item 0"), std::string::npos) << message;
}

TEST_F(RunConfigTest, ANumberKeepsEveryBit) {
  const auto path = write("g.json", R"({"model": "/m", "guidance": 0.1})");
  Command c;
  c.parse({"--config", path});
  EXPECT_EQ(c.o.guidance, 0.1);
}

TEST_F(RunConfigTest, WithoutConfigTheArgumentsAreUntouched) {
  Command c;
  const std::vector<std::string> args{"--model", "m", "--steps", "3"};
  EXPECT_EQ(expand_run_config(*c.cmd, args), args);
}

TEST_F(RunConfigTest, AnUnknownKeyIsNamedWithTheFileAndTheLikelySpelling) {
  const auto path = write("u.json", R"({"model": "/m", "device_map": "auto"})");
  const auto message = error_of({"--config", path});
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("unknown key 'device_map'"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'device-map'"), std::string::npos) << message;
  const auto other = error_of({"--config", write("v.json", R"({"colour": "red"})")});
  EXPECT_NE(other.find("unknown key 'colour'"), std::string::npos) << other;
  EXPECT_NE(other.find("steps"), std::string::npos) << other;  // lists what the command takes
  EXPECT_EQ(error_of({"--config", write("h.json", R"({"help": true})")}).find("unknown key 'help'") == std::string::npos,
            false);
}

// Issue 21: the README promised a spelling suggestion; only case and '_' were handled.
TEST_F(RunConfigTest, AMisspeltKeyGetsTheNearestFlagByEditDistance) {
  for (const auto& [typo, meant] : std::vector<std::pair<std::string, std::string>>{
           {"stpes", "steps"}, {"sed", "seed"}, {"guidence", "guidance"}, {"devicemap", "device-map"},
           {"Prompts", "prompt"}}) {
    const auto message = error_of({"--config", write(typo + ".json", "{\"" + typo + "\": 1}")});
    EXPECT_NE(message.find("unknown key '" + typo + "' (did you mean '" + meant + "'?"), std::string::npos) << message;
  }
  const auto far = error_of({"--config", write("far.json", R"({"resolution": 1})")});
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
}

// Issue 21: a key given twice was accepted, the last one winning.
TEST_F(RunConfigTest, AKeyGivenTwiceIsRefused) {
  const auto path = write("twice.json", R"({"model": "/m", "steps": 4, "seed": 1, "steps": 50})");
  const auto message = error_of({"--config", path});
  EXPECT_NE(message.find(path + ": key 'steps' appears twice in the top-level object"), std::string::npos) << message;
  const auto nested = error_of({"--config", write("nested.json", R"({"model": "/m", "x": {"a": 1, "a": 2}})")});
  EXPECT_NE(nested.find("key 'a' appears twice in object 'x'"), std::string::npos) << nested;
  // The same key in two different objects is no duplicate.
  Command c;
  c.parse({"--config", write("fine.json", R"({"model": "/m", "description": {"steps": 1}, "steps": 4})")});
  EXPECT_EQ(c.o.steps, 4);
}

TEST_F(RunConfigTest, AWrongTypeIsNamedWithTheKeyAndTheFile) {
  struct Case {
    const char* json;
    const char* expected;
  };
  for (const Case& k : {Case{R"({"steps": "50"})", "key 'steps': expected an integer, got a string"},
                        Case{R"({"steps": 2.5})", "key 'steps': expected an integer, got a non-integer number"},
                        Case{R"({"seed": -1})", "key 'seed': expected a non-negative integer, got an integer"},
                        Case{R"({"guidance": "3.5"})", "key 'guidance': expected a number, got a string"},
                        Case{R"({"model": 3})", "key 'model': expected a string, got an integer"},
                        Case{R"({"model": ["a"]})", "key 'model': expected a string, got an array"},
                        Case{R"({"prompt": ["a", 2]})", "key 'prompt' item 1: expected a string, got an integer"},
                        Case{R"({"prompt": []})", "key 'prompt': an empty array"},
                        Case{R"({"verbose": 1})", "key 'verbose': expected true or false, got an integer"},
                        Case{R"({"height": null})", "key 'height': expected an integer, got null"}}) {
    const auto path = write("t.json", k.json);
    const auto message = error_of({"--config", path});
    EXPECT_NE(message.find(path), std::string::npos) << k.json << " -> " << message;
    EXPECT_NE(message.find(k.expected), std::string::npos) << k.json << " -> " << message;
  }
}

TEST_F(RunConfigTest, AFileThatIsNotAConfigIsRefused) {
  EXPECT_NE(error_of({"--config", write("a.json", "[1, 2]")}).find("expected a JSON object"), std::string::npos);
  EXPECT_NE(error_of({"--config", write("b.json", "{\"steps\": ")}).find("b.json"), std::string::npos);
  EXPECT_NE(error_of({"--config", (dir / "missing.json").string()}).find("missing.json"), std::string::npos);
  EXPECT_NE(error_of({"--config"}).find("--config needs a file"), std::string::npos);
  const auto path = write("c.json", "{}");
  EXPECT_NE(error_of({"--config", path, "--config", path}).find("given 2 times"), std::string::npos);
}

TEST_F(RunConfigTest, AFlagOfAnotherBuildIsDroppedNotFatal) {
  const auto path = write("p.json", R"({"model": "/m", "pipeline-device-map": "balanced"})");
  Command c;
  c.parse({"--config", path});
  EXPECT_EQ(c.o.model, "/m");
  // When the command has the flag, the key is passed to it.
  Command with_flag;
  std::string pipeline_map;
  with_flag.cmd->add_option("--pipeline-device-map", pipeline_map);
  with_flag.parse({"--config", path});
  EXPECT_EQ(pipeline_map, "balanced");
}

}  // namespace
}  // namespace dp::cli
