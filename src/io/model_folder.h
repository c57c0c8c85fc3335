#pragma once
// A diffusers model folder: model_index.json naming the components, each in its own subfolder.
// A bare component folder (config.json + weights, e.g. transformer/) is accepted as a one-component model.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace dp::io {

struct Component {
  std::string name;        // "transformer", "text_encoder_2", ...
  std::string library;     // "diffusers", "transformers"
  std::string class_name;  // "FluxTransformer2DModel", ...; empty when a bare folder's config names none
  std::string path;        // folder
  bool has_weights = false;
};

class ModelFolder {
 public:
  static ModelFolder open(const std::string& dir);  // throws naming the folder and the rule broken

  const std::string& dir() const { return dir_; }
  // model_index.json's _class_name ("FluxPipeline"); empty for a bare component folder.
  const std::string& pipeline_class() const { return pipeline_class_; }
  const std::vector<Component>& components() const { return components_; }
  bool has(const std::string& name) const;
  const Component& component(const std::string& name) const;  // throws listing what exists
  // config.json (or scheduler_config.json for schedulers) of a component; throws naming the file unless it
  // is a JSON object.
  nlohmann::json config(const std::string& name) const;

 private:
  std::string dir_;
  std::string pipeline_class_;
  std::vector<Component> components_;
};

}  // namespace dp::io
