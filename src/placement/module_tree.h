#pragma once
// A model's module tree as PyTorch registers it: dotted paths equal to checkpoint keys, class names (for
// no-split classes), each module's own tensors and its children in registration order, and byte sizes at
// the run dtype. Modules without parameters (activations, dropout, pos_embed) are nodes too, because
// accelerate's walk gives them device-map entries.
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace dp::placement {

struct ModuleNode {
  std::string path;  // "" for the root
  std::string class_name;
  int parent = -1;
  std::vector<int> children;             // node indices, registration order
  std::vector<std::string> own_tensors;  // full tensor paths, registration order
};

class ModuleTree {
 public:
  explicit ModuleTree(std::string root_class);

  // Adds a child module named `local_name` under `parent`; returns its index.
  int add_module(int parent, const std::string& local_name, const std::string& class_name);
  // Adds one of `module`'s own parameters with its size at the run dtype.
  void add_tensor(int module, const std::string& local_name, int64_t bytes);
  void set_tensor_bytes(const std::string& path, int64_t bytes);  // throws naming the tensor

  int root() const { return 0; }
  const ModuleNode& node(int index) const { return nodes_[index]; }
  std::size_t module_count() const { return nodes_.size(); }
  std::optional<int> find_module(const std::string& path) const;
  bool has_tensor(const std::string& path) const { return tensor_bytes_.count(path) != 0; }
  int64_t tensor_bytes(const std::string& path) const;
  // Bytes of a module's whole subtree, or of one tensor; 0 for a path that holds no tensors.
  int64_t size_of(const std::string& path) const;
  int64_t total_bytes() const { return size_of(""); }

  // Every tensor in named_parameters() order (modules in pre-order, each one's own tensors first).
  std::vector<std::string> tensors_in_order() const;
  // Modules in named_modules() order.
  std::vector<int> modules_in_order() const;

  std::set<std::string> no_split_classes;
  bool is_no_split(int module) const { return no_split_classes.count(nodes_[module].class_name) != 0; }

 private:
  void add_to_ancestors(const std::string& tensor_path, int64_t delta);
  std::vector<ModuleNode> nodes_;
  std::unordered_map<std::string, int> module_index_;
  std::unordered_map<std::string, int64_t> tensor_bytes_;
  std::unordered_map<std::string, int64_t> subtree_bytes_;  // modules and tensors
};

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
std::string join_path(const std::string& parent, const std::string& local);

}  // namespace dp::placement
