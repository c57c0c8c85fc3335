#pragma once
// Where a module can live, as accelerate names it: a GPU index, "cpu" or "disk"; and max_memory, the
// per-device budgets users write as {0: "16GB", 1: "16GB", "cpu": "64GB"}.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dp::placement {

struct Device {
  enum class Kind { gpu, cpu, disk };
  Kind kind = Kind::gpu;
  int index = 0;  // GPU index; 0 for cpu and disk

  static Device gpu(int index) { return {Kind::gpu, index}; }
  static Device cpu() { return {Kind::cpu, 0}; }
  static Device disk() { return {Kind::disk, 0}; }
  bool is_gpu() const { return kind == Kind::gpu; }
  bool offloaded() const { return kind != Kind::gpu; }
  // accelerate's device order: GPUs by index, then cpu, then disk.
  bool operator<(const Device& other) const {
    return kind != other.kind ? kind < other.kind : index < other.index;
  }
  bool operator==(const Device& other) const { return kind == other.kind && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

std::string to_string(const Device& device);       // "0", "cpu", "disk"
nlohmann::json to_json_value(const Device& device);  // 0 (an int), "cpu", "disk": as hf_device_map holds them
// Parses "0", "cpu", "disk" (a max_memory key or a device-map value). `context` names the source in errors.
Device parse_device(const std::string& text, const std::string& context);
// A device-map value: a JSON int, "cpu", "disk" or a digit string.
Device parse_device_value(const nlohmann::json& value, const std::string& context);

// Parses a memory size: an integer is bytes; "16GB"/"16MB"/"16KB" are decimal, "16GiB"/"16MiB"/"16KiB"
// binary; fractions ("1.5GB") are allowed. accelerate reads a lowercase "b" ("16Gb") as bits: that is
// rejected here rather than silently dividing by eight.
int64_t parse_memory_size(const std::string& text, const std::string& context);
int64_t parse_memory_size_value(const nlohmann::json& value, const std::string& context);

// max_memory in accelerate's order (GPUs by index, cpu, disk); each device once.
class MaxMemory {
 public:
  // "0=16GB,1=16GB,cpu=64GB" (the CLI form).
  static MaxMemory parse(const std::string& spec);
  // {"0": "16GB", "cpu": 64000000000} (the config-file form).
  static MaxMemory from_json(const nlohmann::json& doc, const std::string& source);

  void set(const Device& device, int64_t bytes);
  bool has(const Device& device) const;
  int64_t at(const Device& device) const;  // throws naming the device
  const std::vector<std::pair<Device, int64_t>>& entries() const { return entries_; }
  std::vector<int> gpu_indices() const;  // all GPU keys, sorted, budget 0 included
  // Every GPU's budget less `bytes` (never below 0), for memory a run holds back from the weights; other
  // devices keep theirs.
  MaxMemory less_on_gpus(int64_t bytes) const;
  nlohmann::ordered_json to_json() const;

 private:
  std::vector<std::pair<Device, int64_t>> entries_;  // kept sorted
};

}  // namespace dp::placement
