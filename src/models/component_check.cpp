#include "models/component_check.h"

#include <filesystem>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/json_file.h"

namespace fs = std::filesystem;

namespace dp::models {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  return out + "]";
}

// The loaders convert whatever float type is stored to the run dtype; integer or bool tensors would convert
// too, silently, and mean a broken file.
bool is_float(io::DType dtype) {
  return dtype == io::DType::F32 || dtype == io::DType::F16 || dtype == io::DType::BF16 || dtype == io::DType::F64;
}

std::string config_path_in(const std::string& dir, const char* file = "config.json") {
  return (fs::path(dir) / file).string();
}

// A caught error's message without the " [src/FILE:LINE]" that dp::Error appends: problems are collected and
// then reported together, from one place.
std::string problem_text(const std::exception& e) {
  std::string text = e.what();
  if (const auto* error = dynamic_cast<const Error*>(&e)) {
    const std::string location = str(" [", error->file(), ":", error->line(), "]");
    if (text.size() >= location.size() && text.compare(text.size() - location.size(), location.size(), location) == 0)
      text.resize(text.size() - location.size());
  }
  return text;
}

// Runs `check`, recording its error as a problem of `component` instead of letting it end the search.
template <typename Check>
auto attempt(std::vector<ComponentProblem>& problems, const std::string& component, Check&& check)
    -> std::optional<decltype(check())> {
  try {
    return check();
  } catch (const std::exception& e) {
    problems.push_back({component, problem_text(e)});
    return std::nullopt;
  }
}

// The configs of a FluxPipeline's components that parsed and matched their weights, with their folders.
struct CheckedPipeline {
  std::optional<ClipTextConfig> clip;
  std::optional<T5Config> t5;
  std::optional<FluxConfig> transformer;
  std::optional<VaeConfig> vae;
  std::map<std::string, std::string> dirs;  // component name -> folder
  std::string config_of(const std::string& component) const { return config_path_in(dirs.at(component)); }
};

// What FluxPipeline assumes of its components together, checked among those that passed on their own.
void check_agreement(const CheckedPipeline& p, std::vector<ComponentProblem>& problems) {
  if (!p.transformer) return;
  const FluxConfig& f = *p.transformer;
  const std::string flux_config = p.config_of("transformer");
  auto fail = [&](const char* component, const std::string& message) { problems.push_back({component, message}); };
  if (f.in_channels % 4 != 0) {
    fail("transformer", str(flux_config, ": in_channels ", f.in_channels,
                            " must be 4 x the latent channels: FluxPipeline packs 2x2 latent patches into each token"));
  }
  const int64_t predicted = f.patch_size * f.patch_size * f.output_channels();
  if (predicted != f.in_channels) {
    fail("transformer", str(flux_config, ": the transformer predicts patch_size^2 x out_channels = ", predicted,
                            " values per token but takes in_channels = ", f.in_channels,
                            "; FluxPipeline's scheduler step adds the prediction to the latents"));
  }
  if (p.t5 && f.joint_attention_dim != p.t5->d_model) {
    fail("transformer", str(flux_config, ": joint_attention_dim ", f.joint_attention_dim, " must equal d_model ",
                            p.t5->d_model, " of ", p.config_of("text_encoder_2"),
                            " (the transformer reads T5's hidden states)"));
  }
  if (p.clip && f.pooled_projection_dim != p.clip->hidden_size) {
    fail("transformer", str(flux_config, ": pooled_projection_dim ", f.pooled_projection_dim,
                            " must equal hidden_size ", p.clip->hidden_size, " of ", p.config_of("text_encoder"),
                            " (the transformer reads CLIP's pooled output)"));
  }
  if (p.vae && p.vae->latent_channels * 4 != f.in_channels) {
    fail("vae", str(p.config_of("vae"), ": latent_channels ", p.vae->latent_channels, " x 4 must equal in_channels ",
                    f.in_channels, " of ", flux_config, " (FluxPipeline packs 2x2 latent patches)"));
  }
}

}  // namespace

void check_weights_match(const io::WeightIndex& weights, const ParameterShapes& expected,
                         const std::string& config_path, const std::string& prefix) {
  std::string first;
  std::size_t disagreements = 0;
  for (const auto& p : expected) {
    const std::string key = prefix.empty() ? p.name : prefix + "." + p.name;
    std::string problem;
    if (!weights.contains(key)) {
      problem = str(weights.dir(), ": no tensor '", key, "', which ", config_path, " implies with shape ",
                    shape_text(p.shape));
    } else if (const auto& info = weights.info(key); info.shape != p.shape) {
      problem = str(weights.shard_path(key), ": tensor '", key, "' has shape ", shape_text(info.shape), " but ",
                    config_path, " implies ", shape_text(p.shape));
    } else if (!is_float(info.dtype)) {
      problem = str(weights.shard_path(key), ": tensor '", key, "' is stored as ", io::dtype_name(info.dtype),
                    "; weights must be F32, F16, BF16 or F64");
    }
    if (problem.empty()) continue;
    if (first.empty()) first = problem;
    ++disagreements;
  }
  if (disagreements == 0) return;
  DP_FAIL(first, disagreements == 1 ? std::string() : str(" (and ", disagreements - 1, " more tensors disagree)"));
}

ClipTextConfig check_clip_text_component(const std::string& dir) {
  const std::string config_path = config_path_in(dir);
  const auto config = ClipTextConfig::from_json(read_json_file(config_path), config_path);
  const auto weights = io::WeightIndex::open_dir(dir);
  const std::string legacy = kClipTextLegacyPrefix;
  const bool prefixed = weights.contains(legacy + ".embeddings.token_embedding.weight");
  check_weights_match(weights, clip_text_parameter_shapes(config), config_path, prefixed ? legacy : "");
  return config;
}

T5Config check_t5_encoder_component(const std::string& dir) {
  const std::string config_path = config_path_in(dir);
  const auto config = T5Config::from_json(read_json_file(config_path), config_path);
  const auto weights = io::WeightIndex::open_dir(dir);
  ParameterShapes expected = t5_encoder_parameter_shapes(config);
  for (auto& p : expected) {
    if (p.name == "shared.weight" && !weights.contains(p.name) && weights.contains(kT5TiedEmbeddingKey))
      p.name = kT5TiedEmbeddingKey;
  }
  check_weights_match(weights, expected, config_path);
  return config;
}

FluxConfig check_flux_transformer_component(const std::string& dir) {
  const std::string config_path = config_path_in(dir);
  const auto config = FluxConfig::from_json(read_json_file(config_path), config_path);
  check_weights_match(io::WeightIndex::open_dir(dir), flux_parameter_shapes(config), config_path);
  return config;
}

VaeConfig check_vae_component(const std::string& dir, VaeParts parts) {
  const std::string config_path = config_path_in(dir);
  const auto config = VaeConfig::from_json(read_json_file(config_path), config_path);
  check_weights_match(io::WeightIndex::open_dir(dir), vae_parameter_shapes(config, parts), config_path);
  return config;
}

schedulers::FlowMatchSchedulerConfig check_scheduler_component(const std::string& dir) {
  return schedulers::FlowMatchSchedulerConfig::from_file(config_path_in(dir, "scheduler_config.json"));
}

std::vector<ComponentProblem> check_flux_pipeline(const io::ModelFolder& folder, bool decode) {
  // Each role and the class FluxPipeline runs in it; the tokenizers' files are read by src/tokenizers.
  struct Role {
    std::string name;
    std::string class_name;  // empty: not checked
  };
  std::vector<Role> roles = {{"scheduler", "FlowMatchEulerDiscreteScheduler"},
                             {"tokenizer", ""},
                             {"text_encoder", "CLIPTextModel"},
                             {"tokenizer_2", ""},
                             {"text_encoder_2", "T5EncoderModel"},
                             {"transformer", "FluxTransformer2DModel"}};
  if (decode) roles.push_back({"vae", "AutoencoderKL"});

  std::vector<ComponentProblem> problems;
  CheckedPipeline checked;
  for (const Role& role : roles) {
    const auto component = attempt(problems, role.name, [&] { return &folder.component(role.name); });
    if (!component) continue;
    const std::string& class_name = (*component)->class_name;
    if (!role.class_name.empty() && !class_name.empty() && class_name != role.class_name) {
      problems.push_back({role.name, str(folder.dir(), "/model_index.json: component '", role.name, "' is a ",
                                         class_name, " but FluxPipeline runs a ", role.class_name, " there")});
      continue;
    }
    checked.dirs[role.name] = (*component)->path;
  }
  auto run = [&](const char* name, auto&& check) {
    return checked.dirs.count(name) ? attempt(problems, name, [&] { return check(checked.dirs.at(name)); })
                                    : std::nullopt;
  };
  run("scheduler", check_scheduler_component);
  checked.clip = run("text_encoder", check_clip_text_component);
  checked.t5 = run("text_encoder_2", check_t5_encoder_component);
  checked.transformer = run("transformer", check_flux_transformer_component);
  if (decode) checked.vae = run("vae", [](const std::string& dir) { return check_vae_component(dir, VaeParts::decoder); });
  check_agreement(checked, problems);
  return problems;
}

std::vector<ComponentProblem> check_model_folder(const io::ModelFolder& folder) {
  std::vector<ComponentProblem> problems;
  CheckedPipeline checked;
  for (const auto& component : folder.components()) {
    const std::string& kind = component.class_name;
    const std::string& dir = component.path;
    if (!attempt(problems, component.name, [&] { return &folder.component(component.name); })) continue;
    // Whatever the class, the header parser checks that every tensor lies within its file.
    if (component.has_weights &&
        !attempt(problems, component.name, [&] { return io::WeightIndex::open_dir(dir).size(); })) {
      continue;
    }
    const bool known = kind == "CLIPTextModel" || kind == "T5EncoderModel" || kind == "FluxTransformer2DModel" ||
                       kind == "AutoencoderKL" || kind == "FlowMatchEulerDiscreteScheduler";
    if (!known) continue;
    checked.dirs[component.name] = dir;
    if (kind == "CLIPTextModel") {
      const auto config = attempt(problems, component.name, [&] { return check_clip_text_component(dir); });
      if (component.name == "text_encoder") checked.clip = config;
    } else if (kind == "T5EncoderModel") {
      const auto config = attempt(problems, component.name, [&] { return check_t5_encoder_component(dir); });
      if (component.name == "text_encoder_2") checked.t5 = config;
    } else if (kind == "FluxTransformer2DModel") {
      const auto config = attempt(problems, component.name, [&] { return check_flux_transformer_component(dir); });
      if (component.name == "transformer") checked.transformer = config;
    } else if (kind == "AutoencoderKL") {
      const auto config =
          attempt(problems, component.name, [&] { return check_vae_component(dir, VaeParts::decoder); });
      if (component.name == "vae") checked.vae = config;
    } else {
      attempt(problems, component.name, [&] { return check_scheduler_component(dir); });
    }
  }
  // Fill, depth and canny transformers take more channels than they predict: the agreements are FluxPipeline's.
  if (folder.pipeline_class() == "FluxPipeline") check_agreement(checked, problems);
  return problems;
}

void throw_if_problems(const std::vector<ComponentProblem>& problems, const std::string& folder_dir) {
  if (problems.empty()) return;
  if (problems.size() == 1) DP_FAIL(problems.front().message);
  std::string listed;
  for (const auto& p : problems) listed += str("\n  ", p.component, ": ", p.message);
  DP_FAIL(folder_dir, ": ", problems.size(), " problems, found before loading any weights:", listed);
}

}  // namespace dp::models
