#pragma once
// The weights of one model component (a folder such as transformer/): a single *.safetensors file or
// shards listed by *.safetensors.index.json. Headers are read up front; shards are mapped on first use,
// so a rank that owns a few blocks touches only the bytes of those blocks.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace dp::io {

class WeightIndex {
 public:
  // Opens the weights in `dir`. Prefers an index file when present; otherwise expects exactly one
  // *.safetensors file. Throws naming the folder and the rule broken.
  static WeightIndex open_dir(const std::string& dir);

  struct Entry {
    const TensorInfo* info;
    std::size_t shard;
  };

  const std::string& dir() const { return dir_; }
  std::size_t size() const { return entries_.size(); }
  const std::vector<std::string>& names() const { return names_; }  // sorted
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws naming the folder and tensor
  const std::string& shard_path(const std::string& name) const;
  uint64_t total_bytes() const;
  // Maps the shard holding `name` (once) and returns it.
  std::shared_ptr<SafetensorsFile> mapped_file(const std::string& name) const;

 private:
  struct Shard {
    std::string path;
    SafetensorsHeader header;
    mutable std::shared_ptr<SafetensorsFile> mapped;
  };
  const Entry& entry(const std::string& name) const;

  std::string dir_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::string> names_;
  std::vector<Entry> entries_;  // parallel to names_
  mutable std::unique_ptr<std::mutex> map_mutex_ = std::make_unique<std::mutex>();
};

}  // namespace dp::io
