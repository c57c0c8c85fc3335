#include "placement/module_tree.h"

#include "core/error.h"

namespace dp::placement {

std::string join_path(const std::string& parent, const std::string& local) {
  return parent.empty() ? local : parent + "." + local;
}

ModuleTree::ModuleTree(std::string root_class) {
  nodes_.push_back({"", std::move(root_class), -1, {}, {}});
  module_index_[""] = 0;
}

int ModuleTree::add_module(int parent, const std::string& local_name, const std::string& class_name) {
  DP_CHECK(parent >= 0 && parent < static_cast<int>(nodes_.size()), "module tree: bad parent index ", parent);
  const std::string path = join_path(nodes_[parent].path, local_name);
  DP_CHECK(module_index_.count(path) == 0, "module tree: module '", path, "' added twice");
  const int index = static_cast<int>(nodes_.size());
  nodes_.push_back({path, class_name, parent, {}, {}});
  nodes_[parent].children.push_back(index);
  module_index_[path] = index;
  return index;
}

void ModuleTree::add_tensor(int module, const std::string& local_name, int64_t bytes) {
  const std::string path = join_path(nodes_[module].path, local_name);
  DP_CHECK(tensor_bytes_.count(path) == 0, "module tree: tensor '", path, "' added twice");
  nodes_[module].own_tensors.push_back(path);
  tensor_bytes_[path] = 0;
  set_tensor_bytes(path, bytes);
}

void ModuleTree::set_tensor_bytes(const std::string& path, int64_t bytes) {
  auto it = tensor_bytes_.find(path);
  DP_CHECK(it != tensor_bytes_.end(), "module tree: no tensor '", path, "'");
  DP_CHECK(bytes >= 0, "module tree: tensor '", path, "' has negative size ", bytes);
  add_to_ancestors(path, bytes - it->second);
  it->second = bytes;
}

void ModuleTree::add_to_ancestors(const std::string& tensor_path, int64_t delta) {
  subtree_bytes_[tensor_path] += delta;
  subtree_bytes_[""] += delta;
  for (std::size_t dot = tensor_path.find('.'); dot != std::string::npos; dot = tensor_path.find('.', dot + 1))
    subtree_bytes_[tensor_path.substr(0, dot)] += delta;
}

std::optional<int> ModuleTree::find_module(const std::string& path) const {
  auto it = module_index_.find(path);
  if (it == module_index_.end()) return std::nullopt;
  return it->second;
}

int64_t ModuleTree::tensor_bytes(const std::string& path) const {
  auto it = tensor_bytes_.find(path);
  DP_CHECK(it != tensor_bytes_.end(), "module tree: no tensor '", path, "'");
  return it->second;
}

int64_t ModuleTree::size_of(const std::string& path) const {
  auto it = subtree_bytes_.find(path);
  return it == subtree_bytes_.end() ? 0 : it->second;
}

std::vector<int> ModuleTree::modules_in_order() const {
  std::vector<int> order;
  std::vector<int> stack = {0};
  while (!stack.empty()) {
    const int index = stack.back();
    stack.pop_back();
    order.push_back(index);
    const auto& children = nodes_[index].children;
    for (auto it = children.rbegin(); it != children.rend(); ++it) stack.push_back(*it);
  }
  return order;
}

std::vector<std::string> ModuleTree::tensors_in_order() const {
  std::vector<std::string> out;
  for (int index : modules_in_order())
    for (const auto& t : nodes_[index].own_tensors) out.push_back(t);
  return out;
}

}  // namespace dp::placement
