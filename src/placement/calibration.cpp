#include "placement/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_file.h"

namespace fs = std::filesystem;

namespace dp::placement {
namespace {

// A calibration file holds a few dozen entries; anything near this is not one.
constexpr uint64_t kMaxCalibrationBytes = uint64_t{1} << 20;
constexpr std::size_t kMaxEntries = 4096;

bool same_shape(const CalibrationKey& a, const CalibrationKey& b) {
  return a.dtype == b.dtype && a.height == b.height && a.width == b.width && a.text_tokens == b.text_tokens;
}

CalibrationEntry entry_from_json(const nlohmann::json& item, const std::string& source) {
  require_json_object(item, source);
  static const std::set<std::string> known = {"device", "dtype", "height", "width", "text_tokens", "microbatch",
                                              "embedders_ms", "double_block_ms", "single_block_ms", "output_ms", "runs"};
  for (const auto& field : item.items())
    DP_CHECK(known.count(field.key()), source, ": unknown field '", field.key(), "'");
  CalibrationEntry e;
  e.key.device = json_get<std::string>(item, "device", source);
  e.key.dtype = json_get<std::string>(item, "dtype", source);
  DP_CHECK(!e.key.device.empty() && e.key.device.size() <= 256, source, ": 'device' must name a device (1 to 256 characters)");
  DP_CHECK(e.key.dtype == "bf16" || e.key.dtype == "fp16" || e.key.dtype == "fp32", source, ": 'dtype' is '",
           e.key.dtype, "'; expected bf16, fp16 or fp32");
  e.key.height = json_get<int64_t>(item, "height", source);
  e.key.width = json_get<int64_t>(item, "width", source);
  e.key.text_tokens = json_get<int64_t>(item, "text_tokens", source);
  e.key.microbatch = json_get<int64_t>(item, "microbatch", source);
  DP_CHECK(e.key.height > 0 && e.key.width > 0 && e.key.height % 16 == 0 && e.key.width % 16 == 0 &&
               e.key.height <= 16384 && e.key.width <= 16384,
           source, ": shape ", e.key.height, "x", e.key.width, " must be positive multiples of 16 up to 16384");
  DP_CHECK(e.key.text_tokens >= 1 && e.key.text_tokens <= 65536, source, ": 'text_tokens' ", e.key.text_tokens,
           " is outside 1 to 65536");
  DP_CHECK(e.key.microbatch >= 1 && e.key.microbatch <= 4096, source, ": 'microbatch' ", e.key.microbatch,
           " is outside 1 to 4096");
  const std::pair<const char*, double*> times[] = {{"embedders_ms", &e.times.embedders_ms},
                                                   {"double_block_ms", &e.times.double_block_ms},
                                                   {"single_block_ms", &e.times.single_block_ms},
                                                   {"output_ms", &e.times.output_ms}};
  for (const auto& [name, out] : times) {
    *out = json_get<double>(item, name, source);
    // Blocks must take time; the embedders and the head may round to zero on a tiny model.
    const bool block = std::string(name).find("block") != std::string::npos;
    DP_CHECK(std::isfinite(*out) && (block ? *out > 0 : *out >= 0) && *out < 1e7, source, ": '", name, "' is ",
             *out, " ms; expected a finite ", block ? "positive" : "non-negative", " time below 1e7 ms");
  }
  e.runs = json_get<int>(item, "runs", source);
  DP_CHECK(e.runs >= 1, source, ": 'runs' must be at least 1, got ", e.runs);
  return e;
}

nlohmann::json entry_to_json(const CalibrationEntry& e) {
  return {{"device", e.key.device}, {"dtype", e.key.dtype}, {"height", e.key.height}, {"width", e.key.width},
          {"text_tokens", e.key.text_tokens}, {"microbatch", e.key.microbatch},
          {"embedders_ms", e.times.embedders_ms}, {"double_block_ms", e.times.double_block_ms},
          {"single_block_ms", e.times.single_block_ms}, {"output_ms", e.times.output_ms}, {"runs", e.runs}};
}

double step_ms(const CalibratedTimes& t) { return t.embedders_ms + t.double_block_ms + t.single_block_ms + t.output_ms; }

}  // namespace

std::string describe_key(const CalibrationKey& k) {
  return str(k.device.empty() ? std::string("any device") : k.device, ", ", k.dtype, ", ", k.height, "x", k.width,
             ", ", k.text_tokens, " text tokens, microbatch ", k.microbatch);
}

std::string default_calibration_path() {
  if (const char* explicit_path = std::getenv("DIFFPIPE_CALIBRATION"); explicit_path && *explicit_path)
    return explicit_path;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache)
    return (fs::path(cache) / "diffpipe" / "calibration.json").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : ".") / ".cache" / "diffpipe" / "calibration.json").string();
}

std::vector<CalibrationEntry> read_calibration(const std::string& path) {
  const nlohmann::json doc = read_json_file(path, kMaxCalibrationBytes, DuplicateKeys::refuse);
  require_json_object(doc, path);
  const std::string format = json_get<std::string>(doc, "format", path);
  DP_CHECK(format == kCalibrationFormat, path, ": 'format' is '", format, "', not a ", kCalibrationFormat,
           " file (write one with `diffpipe calibrate`)");
  const int version = json_get<int>(doc, "version", path);
  DP_CHECK(version == kCalibrationVersion, path, ": calibration version ", version, "; this build reads version ",
           kCalibrationVersion, " (calibrate again)");
  DP_CHECK(doc.contains("entries") && doc["entries"].is_array(), path, ": 'entries' must be an array");
  const auto& items = doc["entries"];
  DP_CHECK(items.size() <= kMaxEntries, path, ": ", items.size(), " entries; at most ", kMaxEntries);
  std::vector<CalibrationEntry> out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto e = entry_from_json(items[i], str(path, ": entries[", i, "]"));
    for (const auto& seen : out)
      DP_CHECK(!(seen.key == e.key), path, ": entries[", i, "] repeats the key ", describe_key(e.key));
    out.push_back(std::move(e));
  }
  return out;
}

void write_calibration(const std::string& path, const std::vector<CalibrationEntry>& entries) {
  std::vector<CalibrationEntry> merged;
  if (fs::exists(path)) merged = read_calibration(path);  // a damaged file is not overwritten quietly
  for (const auto& e : entries) {
    auto same = std::find_if(merged.begin(), merged.end(), [&](const CalibrationEntry& m) { return m.key == e.key; });
    if (same != merged.end()) *same = e;
    else merged.push_back(e);
  }
  nlohmann::json doc = {{"format", kCalibrationFormat}, {"version", kCalibrationVersion}, {"entries", nlohmann::json::array()}};
  for (const auto& e : merged) doc["entries"].push_back(entry_to_json(e));
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  write_file_atomically(path, doc.dump(2) + "\n");
}

CalibrationMatch find_calibration(const std::vector<CalibrationEntry>& entries, const CalibrationKey& key) {
  std::vector<const CalibrationEntry*> candidates;
  for (const auto& e : entries)
    if (same_shape(e.key, key) && e.key.microbatch == key.microbatch && (key.device.empty() || e.key.device == key.device))
      candidates.push_back(&e);
  if (candidates.size() == 1) return {*candidates.front(), ""};
  if (candidates.size() > 1) {
    std::string devices;
    for (const auto* c : candidates) devices += str(devices.empty() ? "" : ", ", "'", c->key.device, "'");
    return {std::nullopt, str("entries for several devices match ", describe_key(key), " (", devices,
                               "); name one with --calibration-device")};
  }
  // Say what is there, closest first: the same device, then the same shape.
  std::string have;
  int listed = 0;
  for (const auto& e : entries) {
    if (!key.device.empty() && e.key.device != key.device) continue;
    if (listed++ < 6) have += str(have.empty() ? "" : "; ", describe_key(e.key));
  }
  if (have.empty()) {
    std::set<std::string> devices;
    for (const auto& e : entries) devices.insert("'" + e.key.device + "'");
    std::string names;
    for (const auto& d : devices) names += (names.empty() ? "" : ", ") + d;
    return {std::nullopt, entries.empty() ? std::string("the file has no entries")
                                          : str("no entry for device '", key.device, "' (the file has ", names, ")")};
  }
  return {std::nullopt, str("no entry for ", describe_key(key), " (the file has ", have, listed > 6 ? "; ..." : "", ")")};
}

CalibrationChoice choose_calibration(const std::string& path, const CalibrationKey& key) {
  CalibrationChoice out;
  const bool given = !path.empty();
  out.path = given ? path : default_calibration_path();
  const std::string flop = "planned from FLOP-scaled block times";
  if (!given && !fs::exists(out.path)) {
    out.message = str(flop, " (no calibration file at ", out.path, "; write one with `diffpipe calibrate`)");
    return out;
  }
  try {
    out.entries = read_calibration(out.path);
  } catch (const Error& e) {
    if (given) throw;
    out.message = str(flop, " (the default calibration file is not used: ", e.what(), ")");
    return out;
  }
  const CalibrationMatch match = find_calibration(out.entries, key);
  if (!match.entry) {
    out.message = str(flop, " (calibration ", out.path, " not used: ", match.reason, ")");
    return out;
  }
  out.entry = match.entry;
  out.source = str(out.path, " (", describe_key(match.entry->key), ")");
  out.message = str("planned from calibrated block times: ", out.source);
  return out;
}

std::vector<std::pair<int64_t, double>> calibrated_efficiency_curve(const std::vector<CalibrationEntry>& entries,
                                                                    const CalibrationKey& key) {
  std::map<int64_t, double> per_image;  // microbatch -> ms per image for one forward
  for (const auto& e : entries)
    if (same_shape(e.key, key) && (key.device.empty() || e.key.device == key.device))
      per_image[e.key.microbatch] = step_ms(e.times) / static_cast<double>(e.key.microbatch);
  if (per_image.size() < 2) return {};
  double best = per_image.begin()->second;
  for (const auto& [m, ms] : per_image) best = std::min(best, ms);
  std::vector<std::pair<int64_t, double>> curve;
  for (const auto& [m, ms] : per_image) curve.emplace_back(m, best / ms);
  return curve;
}

}  // namespace dp::placement
