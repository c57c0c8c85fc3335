#include "io/safetensors_writer.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"

namespace dp::io {

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  for (const auto& t : tensors_) DP_CHECK(t.name != name, "safetensors writer: tensor '", name, "' added twice");
  TensorInfo info;
  info.name = name;
  info.dtype = dtype;
  info.shape = std::move(shape);
  info.begin = cursor_;
  info.end = cursor_ + info.numel() * dtype_size(dtype);
  cursor_ = info.end;
  tensors_.push_back(std::move(info));
}

void SafetensorsWriter::write(const std::string& path,
                              const std::function<void(std::size_t, void*, uint64_t)>& fill,
                              bool sparse_data) const {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  for (const auto& t : tensors_) {
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string text = header.dump();
  // Pad with spaces so the data buffer starts 8-byte aligned, as the reference writer does.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  AtomicFile output(path);
  output.write([&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DP_CHECK(out.good(), tmp, ": cannot open for writing");
    uint64_t length = text.size();
    unsigned char prefix[8];
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>((length >> (8 * i)) & 0xff);
    out.write(reinterpret_cast<const char*>(prefix), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (sparse_data) {
      out.close();
      std::filesystem::resize_file(tmp, 8 + text.size() + cursor_);
    } else {
      std::vector<char> buffer;
      for (std::size_t i = 0; i < tensors_.size(); ++i) {
        buffer.resize(tensors_[i].nbytes());
        if (!buffer.empty()) fill(i, buffer.data(), buffer.size());
        out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      }
      out.flush();
      DP_CHECK(out.good(), path, ": write failed");
    }
  });
  output.commit();
}

}  // namespace dp::io
