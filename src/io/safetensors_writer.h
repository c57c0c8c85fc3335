#pragma once
// Writes safetensors files. Tensors are declared first (name, dtype, shape), then their bytes are streamed
// in declaration order, so a full-size checkpoint never has to sit in memory.
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace dp::io {

class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Bytes of all tensors declared so far, in declaration order.
  uint64_t data_bytes() const { return cursor_; }
  // Writes the file. `fill(index, buffer, nbytes)` must write tensor `index`'s bytes into `buffer`.
  // With `sparse_data`, the data region is left as a hole (header-only checkpoints for planning tests).
  void write(const std::string& path, const std::function<void(std::size_t, void*, uint64_t)>& fill,
             bool sparse_data = false) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }

 private:
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  uint64_t cursor_ = 0;
};

}  // namespace dp::io
