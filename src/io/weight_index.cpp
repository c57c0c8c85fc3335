#include "io/weight_index.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_file.h"

namespace fs = std::filesystem;

namespace dp::io {
namespace {

std::vector<fs::path> files_with_suffix(const fs::path& dir, const std::string& suffix) {
  std::vector<fs::path> found;
  for (const auto& item : fs::directory_iterator(dir)) {
    const std::string name = item.path().filename().string();
    if (item.is_regular_file() && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      found.push_back(item.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

WeightIndex WeightIndex::open_dir(const std::string& dir) {
  WeightIndex index;
  index.dir_ = dir;
  DP_CHECK(fs::is_directory(dir), dir, ": not a directory");
  const auto index_files = files_with_suffix(dir, ".safetensors.index.json");
  DP_CHECK(index_files.size() <= 1, dir, ": more than one *.safetensors.index.json");
  std::map<std::string, std::size_t> shard_of;  // tensor -> shard, as the index claims
  if (!index_files.empty()) {
    const auto path = index_files.front().string();
    const nlohmann::json doc = dp::read_json_file(path);
    DP_CHECK(doc.is_object() && doc.contains("weight_map") && doc["weight_map"].is_object(), path,
             ": expected an object with a 'weight_map' object");
    std::map<std::string, std::size_t> shard_number;
    for (const auto& item : doc["weight_map"].items()) {
      DP_CHECK(item.value().is_string(), path, ": weight_map entry '", item.key(), "' must name a file");
      const std::string file = item.value().get<std::string>();
      DP_CHECK(!file.empty() && file.find('/') == std::string::npos && file.find('\\') == std::string::npos &&
                   file != "." && file != "..",
               path, ": weight_map entry '", item.key(), "' names '", file, "', which is not a plain file name");
      auto [it, added] = shard_number.emplace(file, index.shards_.size());
      if (added) {
        auto shard = std::make_unique<Shard>();
        shard->path = (fs::path(dir) / file).string();
        index.shards_.push_back(std::move(shard));
      }
      shard_of[item.key()] = it->second;
    }
    DP_CHECK(!index.shards_.empty(), path, ": weight_map is empty");
  } else {
    const auto files = files_with_suffix(dir, ".safetensors");
    DP_CHECK(!files.empty(), dir, ": no *.safetensors file and no *.safetensors.index.json");
    DP_CHECK(files.size() == 1, dir, ": ", files.size(),
             " *.safetensors files but no index file saying which tensor lives where");
    auto shard = std::make_unique<Shard>();
    shard->path = files.front().string();
    index.shards_.push_back(std::move(shard));
  }

  std::map<std::string, Entry> all;
  for (std::size_t s = 0; s < index.shards_.size(); ++s) {
    Shard& shard = *index.shards_[s];
    shard.header = read_safetensors_header(shard.path);
    for (const auto& info : shard.header.tensors) {
      auto [it, added] = all.emplace(info.name, Entry{&info, s});
      DP_CHECK(added, dir, ": tensor '", info.name, "' is stored in both ", index.shards_[it->second.shard]->path,
               " and ", shard.path);
      if (!shard_of.empty()) {
        auto claimed = shard_of.find(info.name);
        DP_CHECK(claimed != shard_of.end(), shard.path, ": tensor '", info.name, "' is not listed in the index");
        DP_CHECK(claimed->second == s, dir, ": index places tensor '", info.name, "' in ",
                 index.shards_[claimed->second]->path, " but it is stored in ", shard.path);
      }
    }
  }
  for (const auto& [name, shard] : shard_of) {
    DP_CHECK(all.count(name) != 0, index.shards_[shard]->path, ": the index lists tensor '", name,
             "' but the shard does not hold it");
  }
  for (auto& [name, entry] : all) {
    index.names_.push_back(name);
    index.entries_.push_back(entry);
  }
  return index;
}

const WeightIndex::Entry& WeightIndex::entry(const std::string& name) const {
  auto it = std::lower_bound(names_.begin(), names_.end(), name);
  DP_CHECK(it != names_.end() && *it == name, dir_, ": no tensor named '", name, "'");
  return entries_[static_cast<std::size_t>(it - names_.begin())];
}

bool WeightIndex::contains(const std::string& name) const {
  return std::binary_search(names_.begin(), names_.end(), name);
}

const TensorInfo& WeightIndex::info(const std::string& name) const { return *entry(name).info; }

const std::string& WeightIndex::shard_path(const std::string& name) const { return shards_[entry(name).shard]->path; }

uint64_t WeightIndex::total_bytes() const {
  uint64_t total = 0;
  for (const auto& e : entries_) total += e.info->nbytes();
  return total;
}

std::shared_ptr<SafetensorsFile> WeightIndex::mapped_file(const std::string& name) const {
  const Shard& shard = *shards_[entry(name).shard];
  std::lock_guard<std::mutex> lock(*map_mutex_);
  if (!shard.mapped) shard.mapped = SafetensorsFile::open(shard.path);
  return shard.mapped;
}

}  // namespace dp::io
