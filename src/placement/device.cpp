#include "placement/device.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"

namespace dp::placement {

std::string to_string(const Device& device) {
  switch (device.kind) {
    case Device::Kind::cpu:
      return "cpu";
    case Device::Kind::disk:
      return "disk";
    default:
      return std::to_string(device.index);
  }
}

nlohmann::json to_json_value(const Device& device) {
  if (device.is_gpu()) return device.index;
  return to_string(device);
}

namespace {

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

}  // namespace

Device parse_device(const std::string& text, const std::string& context) {
  if (text == "cpu") return Device::cpu();
  if (text == "disk") return Device::disk();
  DP_CHECK(all_digits(text) && text.size() <= 6, context, ": device '", text,
           "' is not a GPU index (0, 1, ...), \"cpu\" or \"disk\"");
  return Device::gpu(std::stoi(text));
}

Device parse_device_value(const nlohmann::json& value, const std::string& context) {
  if (value.is_number_integer()) {
    const int64_t index = value.get<int64_t>();
    DP_CHECK(index >= 0 && index < 1'000'000, context, ": device ", index, " is not a GPU index (must be >= 0)");
    return Device::gpu(static_cast<int>(index));
  }
  DP_CHECK(value.is_string(), context, ": device ", value.dump(), " must be a GPU index, \"cpu\" or \"disk\"");
  return parse_device(value.get<std::string>(), context);
}

int64_t parse_memory_size(const std::string& raw, const std::string& context) {
  std::string text = raw;
  text.erase(std::remove_if(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); }), text.end());
  DP_CHECK(!text.empty(), context, ": empty memory size");
  if (all_digits(text)) {
    DP_CHECK(text.size() <= 18, context, ": memory size '", raw, "' is too large");
    return std::stoll(text);
  }
  std::size_t unit_start = 0;
  while (unit_start < text.size() && (std::isdigit(static_cast<unsigned char>(text[unit_start])) || text[unit_start] == '.'))
    ++unit_start;
  const std::string number = text.substr(0, unit_start);
  const std::string unit = text.substr(unit_start);
  DP_CHECK(!number.empty() && std::count(number.begin(), number.end(), '.') <= 1 && number != ".", context,
           ": memory size '", raw, "' must start with a number, as in 16GB, 16GiB or 16000000000 (bytes)");
  struct Unit {
    const char* name;
    double scale;
  };
  static const Unit units[] = {{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"KiB", 1024.0},
                               {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const auto& u : units) {
    if (unit == u.name) {
      const double bytes = std::stod(number) * u.scale;
      DP_CHECK(bytes < 9.0e18, context, ": memory size '", raw, "' is too large");
      return static_cast<int64_t>(bytes);  // truncated, as accelerate's int(float(...) * scale)
    }
  }
  if (!unit.empty() && unit.back() == 'b') {
    DP_FAIL(context, ": memory size '", raw, "' ends in a lowercase 'b', which accelerate reads as bits (1/8 of ",
            "the bytes); write '", number, unit.substr(0, unit.size() - 1), "B' for bytes (or divide by 8 yourself)");
  }
  DP_FAIL(context, ": memory size '", raw, "' has unknown unit '", unit,
          "'; use KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024) or a plain integer of bytes");
}

int64_t parse_memory_size_value(const nlohmann::json& value, const std::string& context) {
  if (value.is_number_integer()) {
    const int64_t bytes = value.get<int64_t>();
    DP_CHECK(bytes >= 0, context, ": memory size ", bytes, " must not be negative");
    return bytes;
  }
  DP_CHECK(value.is_string(), context, ": memory size ", value.dump(),
           " must be an integer of bytes or a string such as \"16GB\" or \"16GiB\"");
  return parse_memory_size(value.get<std::string>(), context);
}

namespace {

// entries_ is sorted by device: lookups and inserts find their place by binary search, so a world of
// thousands of GPUs costs n log n rather than a sort per insert and a scan per lookup (plan --world-size).
auto position_of(std::vector<std::pair<Device, int64_t>>& entries, const Device& device) {
  return std::lower_bound(entries.begin(), entries.end(), device,
                          [](const auto& entry, const Device& d) { return entry.first < d; });
}
auto position_of(const std::vector<std::pair<Device, int64_t>>& entries, const Device& device) {
  return std::lower_bound(entries.begin(), entries.end(), device,
                          [](const auto& entry, const Device& d) { return entry.first < d; });
}

}  // namespace

void MaxMemory::set(const Device& device, int64_t bytes) {
  DP_CHECK(bytes >= 0, "max_memory[", to_string(device), "] = ", bytes, " must not be negative");
  const auto at = position_of(entries_, device);
  DP_CHECK(at == entries_.end() || at->first != device, "max_memory names device ", to_string(device), " twice");
  entries_.emplace(at, device, bytes);
}

bool MaxMemory::has(const Device& device) const {
  const auto at = position_of(entries_, device);
  return at != entries_.end() && at->first == device;
}

int64_t MaxMemory::at(const Device& device) const {
  const auto found = position_of(entries_, device);
  DP_CHECK(found != entries_.end() && found->first == device, "max_memory has no entry for device ",
           to_string(device));
  return found->second;
}

std::vector<int> MaxMemory::gpu_indices() const {
  std::vector<int> out;
  for (const auto& [d, bytes] : entries_)
    if (d.is_gpu()) out.push_back(d.index);
  return out;
}

MaxMemory MaxMemory::less_on_gpus(int64_t bytes) const {
  MaxMemory out;
  for (const auto& [d, budget] : entries_) out.set(d, d.is_gpu() ? std::max<int64_t>(0, budget - bytes) : budget);
  return out;
}

nlohmann::ordered_json MaxMemory::to_json() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [d, bytes] : entries_) out[to_string(d)] = bytes;
  return out;
}

MaxMemory MaxMemory::parse(const std::string& spec) {
  MaxMemory out;
  std::size_t start = 0;
  DP_CHECK(!spec.empty(), "--max-memory: empty; expected DEVICE=SIZE pairs such as 0=16GB,1=16GB,cpu=64GB");
  while (start <= spec.size()) {
    const std::size_t comma = spec.find(',', start);
    const std::string item = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::size_t eq = item.find('=');
    DP_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < item.size(), "--max-memory: entry '", item,
             "' must be DEVICE=SIZE, as in 0=16GB or cpu=64GB");
    const std::string key = item.substr(0, eq);
    const Device device = parse_device(key, "--max-memory key '" + key + "'");
    DP_CHECK(!out.has(device), "--max-memory: device '", key, "' appears twice");
    out.set(device, parse_memory_size(item.substr(eq + 1), "--max-memory entry '" + item + "'"));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

MaxMemory MaxMemory::from_json(const nlohmann::json& doc, const std::string& source) {
  DP_CHECK(doc.is_object(), source, ": max_memory must be an object such as {\"0\": \"16GB\", \"cpu\": \"64GB\"}");
  MaxMemory out;
  for (const auto& item : doc.items()) {
    const std::string context = source + ": max_memory key '" + item.key() + "'";
    const Device device = parse_device(item.key(), context);
    DP_CHECK(!out.has(device), context, ": device appears twice");
    out.set(device, parse_memory_size_value(item.value(), context));
  }
  return out;
}

}  // namespace dp::placement
