#include "placement/auto_device_map.h"

#include <algorithm>
#include <deque>
#include <set>

#include "core/error.h"

namespace dp::placement {

bool parse_strategy(const std::string& name, Strategy* out) {
  if (name == "auto") *out = Strategy::auto_;
  else if (name == "balanced") *out = Strategy::balanced;
  else if (name == "balanced_low_0") *out = Strategy::balanced_low_0;
  else if (name == "sequential") *out = Strategy::sequential;
  else return false;
  return true;
}

std::string strategy_name(Strategy strategy) {
  switch (strategy) {
    case Strategy::auto_: return "auto";
    case Strategy::balanced: return "balanced";
    case Strategy::balanced_low_0: return "balanced_low_0";
    default: return "sequential";
  }
}

namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

bool subtree_has_tensors(const ModuleTree& tree, int index, std::vector<int>& memo) {
  if (memo[index] >= 0) return memo[index] == 1;
  bool has = !tree.node(index).own_tensors.empty();
  for (int child : tree.node(index).children) has = subtree_has_tensors(tree, child, memo) || has;
  memo[index] = has ? 1 : 0;
  return has;
}

// get_balanced_memory's buffer: 1.25 x the larger of (a) the size of the first module of each no-split
// class, first in tensor registration order, and (b) the mean size of the innermost modules holding
// tensors. Modules without tensors do not exist for accelerate here (its sizes come from tensor names).
int64_t balancing_buffer(const ModuleTree& tree) {
  std::vector<int> memo(tree.module_count(), -1);
  std::map<std::string, int64_t> first_of_class;
  int64_t leaf_total = 0;
  int64_t leaf_count = 0;
  for (int index : tree.modules_in_order()) {
    if (index == tree.root() || !subtree_has_tensors(tree, index, memo)) continue;
    const ModuleNode& node = tree.node(index);
    if (tree.is_no_split(index) && first_of_class.count(node.class_name) == 0)
      first_of_class[node.class_name] = tree.size_of(node.path);
    bool has_tensor_child = false;
    for (int child : node.children) has_tensor_child = has_tensor_child || subtree_has_tensors(tree, child, memo);
    if (!has_tensor_child) {
      leaf_total += tree.size_of(node.path);
      leaf_count += 1;
    }
  }
  int64_t buffer = 0;
  for (const auto& [cls, size] : first_of_class) buffer = std::max(buffer, size);
  // Python's int(sum / len): a correctly rounded double division, truncated.
  const int64_t mean_leaf = static_cast<int64_t>(static_cast<double>(leaf_total) /
                                                 static_cast<double>(std::max<int64_t>(leaf_count, 1)));
  return static_cast<int64_t>(1.25 * static_cast<double>(std::max(buffer, mean_leaf)));
}

}  // namespace

MaxMemory balanced_memory(const ModuleTree& tree, const MaxMemory& max_memory, bool low_zero,
                          bool user_set_max_memory) {
  std::vector<int> gpus;  // GPUs with a budget, by index
  for (const auto& [device, bytes] : max_memory.entries())
    if (device.is_gpu() && bytes > 0) gpus.push_back(device.index);
  const int64_t num_devices = static_cast<int64_t>(gpus.size());
  if (num_devices == 0) return max_memory;

  std::map<Device, int64_t> budget;
  for (const auto& [device, bytes] : max_memory.entries()) budget[device] = bytes;
  if (num_devices == 1) {
    low_zero = false;  // nothing to keep light with one GPU
    if (!user_set_max_memory) {
      for (auto& [device, bytes] : budget) {
        if (!device.is_gpu()) continue;
        bytes = static_cast<int64_t>(static_cast<double>(bytes) * 0.9);  // keep 10% for activations
        break;
      }
    }
  }
  const int64_t total = tree.total_bytes();
  const int64_t per_gpu = total / (low_zero ? num_devices - 1 : num_devices) + balancing_buffer(tree);

  // Every GPU but the last is capped; the last keeps its whole budget in case the buffer is not enough.
  for (std::size_t i = 0; i + 1 < gpus.size(); ++i) {
    const Device d = Device::gpu(gpus[i]);
    if (low_zero && gpus[i] == 0) continue;  // min(budget[0], budget[0]): GPU 0 is set below
    budget[d] = std::min(per_gpu, budget[d]);
  }
  if (low_zero) {
    // accelerate sums GPUs 1..n-1 by index, so the GPUs must be numbered from 0 without gaps.
    int64_t others = 0;
    for (int64_t i = 1; i < num_devices; ++i) {
      const Device d = Device::gpu(static_cast<int>(i));
      DP_CHECK(budget.count(d), "balanced_low_0: max_memory has no GPU ", i,
               "; like accelerate, this strategy needs GPUs numbered 0, 1, ... without gaps");
      others += budget[d];
    }
    DP_CHECK(budget.count(Device::gpu(0)), "balanced_low_0: max_memory has no GPU 0 to keep light");
    budget[Device::gpu(0)] = std::min(std::max<int64_t>(0, total - others), budget[Device::gpu(0)]);
  }
  MaxMemory out;
  for (const auto& [device, bytes] : budget) out.set(device, bytes);
  return out;
}

namespace {

struct WalkItem {
  std::string name;
  int module = -1;  // -1: a tensor
};

std::vector<WalkItem> children_with_own_tensors(const ModuleTree& tree, int module) {
  std::vector<WalkItem> out;
  const ModuleNode& node = tree.node(module);
  for (const auto& t : node.own_tensors) out.push_back({t, -1});
  for (int child : node.children) out.push_back({tree.node(child).path, child});
  return out;
}

// get_max_layer_size: the largest module that will not be split (a no-split class or a module without
// children), and every name that reaches that size.
std::pair<int64_t, std::vector<std::string>> max_layer(const ModuleTree& tree, const std::deque<WalkItem>& items,
                                                       bool modules_only) {
  std::deque<WalkItem> todo;
  for (const auto& item : items)
    if (!modules_only || item.module >= 0) todo.push_back(item);
  int64_t best = 0;
  std::vector<std::string> names;
  while (!todo.empty()) {
    const WalkItem item = todo.front();
    todo.pop_front();
    const bool leaf = item.module < 0 || tree.node(item.module).children.empty() || tree.is_no_split(item.module);
    if (leaf) {
      const int64_t size = tree.size_of(item.name);
      if (size > best) {
        best = size;
        names = {item.name};
      } else if (size == best) {
        names.push_back(item.name);
      }
      continue;
    }
    const auto& children = tree.node(item.module).children;
    for (auto it = children.rbegin(); it != children.rend(); ++it) todo.push_front({tree.node(*it).path, *it});
  }
  return {best, names};
}

}  // namespace

AutoPlacement infer_auto_device_map(const ModuleTree& tree, const MaxMemory& budgets) {
  AutoPlacement result;
  result.budgets = budgets;
  std::vector<Device> devices;
  for (const auto& [device, bytes] : budgets.entries()) devices.push_back(device);
  if (!budgets.has(Device::disk())) devices.push_back(Device::disk());
  std::vector<Device> main_devices = {Device::cpu()};
  for (const Device& d : devices) {
    if (d.is_gpu()) {
      main_devices = {d, Device::cpu()};
      break;
    }
  }
  auto is_main = [&](const Device& d) { return std::find(main_devices.begin(), main_devices.end(), d) != main_devices.end(); };

  std::deque<WalkItem> items;
  for (const auto& item : children_with_own_tensors(tree, tree.root())) items.push_back(item);
  auto [max_layer_size, max_layer_names] = max_layer(tree, items, false);

  std::map<Device, int64_t> used;
  DeviceMap placed;
  std::size_t current = 0;
  while (!items.empty()) {
    const WalkItem item = items.front();
    items.pop_front();
    max_layer_names.erase(std::remove_if(max_layer_names.begin(), max_layer_names.end(),
                                         [&](const std::string& n) { return n == item.name || starts_with(n, item.name + "."); }),
                          max_layer_names.end());
    if (max_layer_names.empty()) std::tie(max_layer_size, max_layer_names) = max_layer(tree, items, true);

    const int64_t size = tree.size_of(item.name);
    DP_CHECK(current < devices.size(), "device map walk ran past the last device at '", item.name, "'");
    const Device device = devices[current];
    const bool unlimited = device.kind == Device::Kind::disk;
    int64_t limit = unlimited ? 0 : budgets.at(device);
    int64_t reservation = 0;
    if (is_main(device)) {
      // An offloaded layer is loaded back onto the main device at run time: keep room for the largest.
      limit -= max_layer_size;
      reservation = max_layer_size;
      result.reserved[device] = reservation;
    }
    if (unlimited || used[device] + size <= limit) {
      used[device] += size;
      result.weights[device] += size;
      placed.emplace_back(item.name, device);
      continue;
    }
    const bool splittable = item.module >= 0 && !tree.node(item.module).children.empty() && !tree.is_no_split(item.module);
    if (splittable) {
      const auto parts = children_with_own_tensors(tree, item.module);
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) items.push_front(*it);
      std::tie(max_layer_size, max_layer_names) = max_layer(tree, items, true);
      continue;
    }
    used[device] += reservation;
    ++current;
    items.push_front(item);
  }
  for (auto it = result.reserved.begin(); it != result.reserved.end();) {
    if (result.weights.count(it->first) == 0) it = result.reserved.erase(it);
    else ++it;
  }
  result.device_map = clean_device_map(std::move(placed));
  return result;
}

namespace {

void clean_under(DeviceMap& map, const std::string& module_name) {
  const std::string prefix = module_name.empty() ? "" : module_name + ".";
  std::set<Device> values;
  std::size_t count = 0;
  for (const auto& [key, device] : map) {
    if (!starts_with(key, prefix)) continue;
    values.insert(device);
    ++count;
  }
  if (values.size() == 1 && count > 1) {
    const Device device = *values.begin();
    map.erase(std::remove_if(map.begin(), map.end(), [&](const auto& e) { return starts_with(e.first, prefix); }),
              map.end());
    map.emplace_back(module_name, device);
  }
  // The next path level below module_name, for every key under it.
  const std::size_t depth = module_name.empty() ? 1 : std::count(module_name.begin(), module_name.end(), '.') + 2;
  std::set<std::string> children;
  for (const auto& entry : map) {
    const std::string& key = entry.first;
    if (!starts_with(key, prefix) || key.size() <= module_name.size()) continue;
    std::size_t end = 0;
    std::size_t parts = 0;
    while (parts < depth) {
      end = key.find('.', parts == 0 ? 0 : end + 1);
      ++parts;
      if (end == std::string::npos) break;
    }
    children.insert(end == std::string::npos ? key : key.substr(0, end));
  }
  for (const auto& child : children) clean_under(map, child);
}

}  // namespace

DeviceMap clean_device_map(DeviceMap map) {
  clean_under(map, "");
  return map;
}

AutoPlacement place_with_strategy(const ModuleTree& tree, Strategy strategy, const MaxMemory& max_memory,
                                  bool user_set_max_memory) {
  if (strategy == Strategy::sequential) return infer_auto_device_map(tree, max_memory);
  return infer_auto_device_map(
      tree, balanced_memory(tree, max_memory, strategy == Strategy::balanced_low_0, user_set_max_memory));
}

}  // namespace dp::placement
