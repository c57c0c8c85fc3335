#include "io/model_folder.h"

#include <filesystem>

#include "core/error.h"
#include "core/json_file.h"

namespace fs = std::filesystem;

namespace dp::io {
namespace {

bool folder_has_weights(const fs::path& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) return false;
  fs::directory_iterator item(dir, error);
  for (; !error && item != fs::directory_iterator(); item.increment(error)) {
    const std::string name = item->path().filename().string();
    if (name.size() > 12 && (name.rfind(".safetensors") == name.size() - 12 ||
                             name.find(".safetensors.index.json") != std::string::npos))
      return true;
  }
  DP_CHECK(!error, dir.string(), ": cannot list the folder: ", error.message());
  return false;
}

// The class a bare component folder's config names: diffusers writes _class_name, transformers architectures.
std::string bare_component_class(const nlohmann::json& config, const std::string& source) {
  const auto diffusers_class = json_get_or<std::string>(config, "_class_name", "", source);
  if (!diffusers_class.empty()) return diffusers_class;
  const auto architectures = json_get_or<std::vector<std::string>>(config, "architectures", {}, source);
  return architectures.size() == 1 ? architectures.front() : "";
}

}  // namespace

ModelFolder ModelFolder::open(const std::string& dir) {
  DP_CHECK(fs::is_directory(dir), dir, ": model folder does not exist or is not a directory");
  ModelFolder folder;
  folder.dir_ = dir;
  const fs::path index_path = fs::path(dir) / "model_index.json";
  if (!fs::exists(index_path)) {
    const fs::path config_path = fs::path(dir) / "config.json";
    DP_CHECK(fs::exists(config_path), dir, ": neither model_index.json (a pipeline) nor config.json (a component)");
    const auto config = read_json_file(config_path.string());
    Component only;
    only.name = fs::path(dir).filename().string();
    only.class_name = bare_component_class(config, config_path.string());
    only.library = "diffusers";
    only.path = dir;
    only.has_weights = folder_has_weights(dir);
    folder.components_.push_back(only);
    return folder;
  }
  const auto index = read_json_file(index_path.string());
  require_json_object(index, index_path.string());
  folder.pipeline_class_ = json_get_or<std::string>(index, "_class_name", "", index_path.string());
  for (const auto& item : index.items()) {
    if (item.key().empty() || item.key()[0] == '_') continue;
    // Components are ["library", "ClassName"]; [null, null] marks an absent optional component. Other
    // values are pipeline settings (SD's requires_safety_checker: true).
    const auto& value = item.value();
    if (!value.is_array()) continue;
    DP_CHECK(value.size() == 2, index_path.string(), ": component '", item.key(), "' must be [library, class]");
    if (value[0].is_null() || value[1].is_null()) continue;
    DP_CHECK(value[0].is_string() && value[1].is_string(), index_path.string(), ": component '", item.key(),
             "' must be [library, class] strings");
    DP_CHECK(item.key().find_first_of("/\\") == std::string::npos && item.key() != "." && item.key() != "..",
             index_path.string(), ": component name '", item.key(), "' is not a plain folder name");
    Component c;
    c.name = item.key();
    c.library = value[0].get<std::string>();
    c.class_name = value[1].get<std::string>();
    c.path = (fs::path(dir) / c.name).string();
    c.has_weights = folder_has_weights(c.path);
    folder.components_.push_back(c);
  }
  return folder;
}

bool ModelFolder::has(const std::string& name) const {
  for (const auto& c : components_)
    if (c.name == name) return true;
  return false;
}

const Component& ModelFolder::component(const std::string& name) const {
  std::string known;
  for (const auto& c : components_) {
    if (c.name == name) {
      DP_CHECK(fs::is_directory(c.path), dir_, ": component '", name, "' is listed in model_index.json but folder ",
               c.path, " is missing");
      return c;
    }
    known += (known.empty() ? "" : ", ") + c.name;
  }
  DP_FAIL(dir_, ": no component '", name, "' (the folder has: ", known.empty() ? "none" : known, ")");
}

nlohmann::json ModelFolder::config(const std::string& name) const {
  const Component& c = component(name);
  for (const char* file : {"config.json", "scheduler_config.json"}) {
    const fs::path path = fs::path(c.path) / file;
    if (!fs::exists(path)) continue;
    auto doc = read_json_file(path.string());
    require_json_object(doc, path.string());
    return doc;
  }
  DP_FAIL(c.path, ": component '", name, "' has no config.json");
}

}  // namespace dp::io
