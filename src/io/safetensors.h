#pragma once
// Safetensors files: a header parser that trusts nothing, and an mmap'd file view over it.
// This layer has no LibTorch dependency so that planning and inspection stay cheap; torch_tensors.h
// turns a validated entry into an at::Tensor.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dp::io {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL };

std::string_view dtype_name(DType dtype);  // as spelled in safetensors headers ("BF16")
std::size_t dtype_size(DType dtype);
bool parse_dtype(std::string_view name, DType* out);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data buffer
  uint64_t end = 0;
  uint64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t header_size = 0;  // bytes of JSON after the 8-byte length
  uint64_t data_offset() const { return 8 + header_size; }
  const TensorInfo* find(std::string_view name) const;
};

// Largest header we accept; the reference implementation uses the same cap.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Validates header JSON against the size of the data buffer that follows it. `source` names the file in
// errors. Throws dp::Error naming the file, the tensor and the rule broken.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_size, const std::string& source);

// Parses a whole in-memory file image (length prefix + header + data). Used by the fuzzer and tests.
SafetensorsHeader parse_safetensors_image(std::string_view image, const std::string& source);

// Reads and validates only the header of a file on disk: cheap even for a sparse 24 GB checkpoint.
SafetensorsHeader read_safetensors_header(const std::string& path);

// A read-only memory map of a whole validated file.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const TensorInfo* find(std::string_view name) const { return header_.find(name); }
  const TensorInfo& at(std::string_view name) const;  // throws naming file and tensor
  const std::byte* data(const TensorInfo& info) const;
  // Bytes [offset, offset + size) of `info`'s data copied into `out` with pread, from the file the mapping was
  // made of (its descriptor stays open). Unlike reading through data(), this maps no page into the process:
  // the CUDA loader stages 34 GB this way, where faulting the mapping in cost page-table work both while
  // reading and at exit (bench/RESULTS.md). Throws naming the file and the byte on a short read.
  void read(const TensorInfo& info, uint64_t offset, uint64_t size, void* out) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  int fd_ = -1;
};

}  // namespace dp::io
