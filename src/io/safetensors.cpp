#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace dp::io {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  std::size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
    {DType::I64, "I64", 8}, {DType::I32, "I32", 4}, {DType::I16, "I16", 2}, {DType::I8, "I8", 1},
    {DType::U64, "U64", 8}, {DType::U32, "U32", 4}, {DType::U16, "U16", 2}, {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
};

// Deeper nesting than this is never valid safetensors and would let a hostile file exhaust the stack.
constexpr int kMaxJsonDepth = 4;

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

uint64_t read_le64(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

uint64_t as_offset(const nlohmann::json& value, const std::string& where) {
  DP_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0), where,
           ": expected a non-negative integer, got ", value.dump());
  return value.get<uint64_t>();
}

TensorInfo parse_entry(const std::string& name, const nlohmann::json& entry, const std::string& source) {
  const std::string where = str(source, ": tensor '", name, "'");
  DP_CHECK(entry.is_object(), where, ": entry must be an object, got ", entry.type_name());
  for (const auto& item : entry.items()) {
    DP_CHECK(item.key() == "dtype" || item.key() == "shape" || item.key() == "data_offsets", where,
             ": unexpected field '", item.key(), "'");
  }
  DP_CHECK(entry.contains("dtype") && entry["dtype"].is_string(), where, ": 'dtype' must be a string");
  DP_CHECK(entry.contains("shape") && entry["shape"].is_array(), where, ": 'shape' must be an array");
  DP_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() && entry["data_offsets"].size() == 2,
           where, ": 'data_offsets' must be an array of two integers");
  TensorInfo info;
  info.name = name;
  const std::string dtype = entry["dtype"].get<std::string>();
  DP_CHECK(parse_dtype(dtype, &info.dtype), where, ": unknown dtype '", dtype,
           "' (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL)");
  uint64_t numel = 1;
  uint64_t nonzero_product = 1;  // a zero extent must not hide dimensions whose strides would overflow
  for (const auto& dim : entry["shape"]) {
    const uint64_t extent = as_offset(dim, where + " shape");
    DP_CHECK(extent <= static_cast<uint64_t>(INT64_MAX), where, ": dimension ", extent, " too large");
    DP_CHECK(checked_mul(numel, extent, &numel), where, ": element count overflows 64 bits");
    if (extent != 0)
      DP_CHECK(checked_mul(nonzero_product, extent, &nonzero_product) && nonzero_product <= static_cast<uint64_t>(INT64_MAX),
               where, ": shape's extents overflow 64 bits");
    info.shape.push_back(static_cast<int64_t>(extent));
  }
  info.begin = as_offset(entry["data_offsets"][0], where + " data_offsets[0]");
  info.end = as_offset(entry["data_offsets"][1], where + " data_offsets[1]");
  DP_CHECK(info.begin <= info.end, where, ": data_offsets begin ", info.begin, " is past end ", info.end);
  uint64_t nbytes = 0;
  DP_CHECK(checked_mul(numel, dtype_size(info.dtype), &nbytes), where, ": byte size overflows 64 bits");
  DP_CHECK(nbytes == info.end - info.begin, where, ": shape and dtype give ", nbytes,
           " bytes but data_offsets cover ", info.end - info.begin);
  return info;
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e.name;
  return "?";
}

std::size_t dtype_size(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e.size;
  return 0;
}

bool parse_dtype(std::string_view name, DType* out) {
  for (const auto& e : kDTypes) {
    if (e.name == name) {
      *out = e.dtype;
      return true;
    }
  }
  return false;
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return (it != tensors.end() && it->name == name) ? &*it : nullptr;
}

SafetensorsHeader parse_safetensors_header(std::string_view json_text, uint64_t data_size, const std::string& source) {
  DP_CHECK(!json_text.empty() && json_text.front() == '{', source, ": header must be a JSON object starting with '{'");
  // nlohmann keeps the last of repeated keys silently; a file that says two things about one tensor (or
  // one field) is ambiguous, so every object's keys must be unique.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto guard = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth > kMaxJsonDepth) throw std::invalid_argument("nesting deeper than " + std::to_string(kMaxJsonDepth));
    if (event == nlohmann::json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == nlohmann::json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == nlohmann::json::parse_event_t::key && !open_objects.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json_text.begin(), json_text.end(), guard);
  } catch (const std::exception& e) {
    DP_FAIL(source, ": header is not valid JSON: ", e.what());
  }
  DP_CHECK(duplicate.empty(), source, ": key '", duplicate, "' appears twice in one object of the header");
  DP_CHECK(header.is_object(), source, ": header must be a JSON object");

  SafetensorsHeader result;
  result.header_size = json_text.size();
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") {
      DP_CHECK(item.value().is_object(), source, ": __metadata__ must be an object of strings");
      for (const auto& meta : item.value().items()) {
        DP_CHECK(meta.value().is_string(), source, ": __metadata__ value for '", meta.key(), "' must be a string");
        result.metadata[meta.key()] = meta.value().get<std::string>();
      }
      continue;
    }
    result.tensors.push_back(parse_entry(item.key(), item.value(), source));
  }

  // The data buffer must be tiled exactly: sort by offset, then every tensor starts where the last ended.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : result.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  for (const TensorInfo* t : by_offset) {
    DP_CHECK(t->begin >= cursor, source, ": tensor '", t->name, "' at bytes [", t->begin, ", ", t->end,
             ") overlaps the previous tensor ending at ", cursor);
    DP_CHECK(t->begin == cursor, source, ": gap of ", t->begin - cursor, " bytes before tensor '", t->name, "'");
    cursor = t->end;
  }
  DP_CHECK(cursor == data_size, source, ": tensors cover ", cursor, " bytes but the data buffer holds ", data_size,
           cursor < data_size ? " (trailing bytes)" : " (file is truncated)");
  std::sort(result.tensors.begin(), result.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return result;
}

namespace {

uint64_t checked_header_length(const unsigned char* prefix, uint64_t file_size, const std::string& source) {
  const uint64_t header_size = read_le64(prefix);
  DP_CHECK(header_size <= kMaxHeaderBytes, source, ": header length ", header_size, " exceeds the limit of ",
           kMaxHeaderBytes, " bytes");
  DP_CHECK(header_size <= file_size - 8, source, ": header length ", header_size, " runs past the end of the ",
           file_size, "-byte file");
  return header_size;
}

}  // namespace

SafetensorsHeader parse_safetensors_image(std::string_view image, const std::string& source) {
  DP_CHECK(image.size() >= 8, source, ": file is ", image.size(), " bytes, shorter than the 8-byte length prefix");
  const auto* bytes = reinterpret_cast<const unsigned char*>(image.data());
  const uint64_t header_size = checked_header_length(bytes, image.size(), source);
  return parse_safetensors_header(image.substr(8, header_size), image.size() - 8 - header_size, source);
}

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t open_and_size(const std::string& path, Fd* file) {
  file->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DP_CHECK(file->fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  DP_CHECK(::fstat(file->fd, &st) == 0, path, ": cannot stat: ", std::strerror(errno));
  DP_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

void read_exact(int fd, void* buffer, std::size_t size, uint64_t offset, const std::string& path) {
  auto* out = static_cast<char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    DP_CHECK(got > 0, path, ": read failed at byte ", offset + done, ": ",
             got == 0 ? "unexpected end of file" : std::strerror(errno));
    done += static_cast<std::size_t>(got);
  }
}

}  // namespace

SafetensorsHeader read_safetensors_header(const std::string& path) {
  Fd file;
  const uint64_t file_size = open_and_size(path, &file);
  DP_CHECK(file_size >= 8, path, ": file is ", file_size, " bytes, shorter than the 8-byte length prefix");
  unsigned char prefix[8];
  read_exact(file.fd, prefix, 8, 0, path);
  const uint64_t header_size = checked_header_length(prefix, file_size, path);
  std::string json(header_size, '\0');
  read_exact(file.fd, json.data(), header_size, 8, path);
  return parse_safetensors_header(json, file_size - 8 - header_size, path);
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  Fd file;
  const uint64_t file_size = open_and_size(path, &file);
  DP_CHECK(file_size >= 8, path, ": file is ", file_size, " bytes, shorter than the 8-byte length prefix");
  std::shared_ptr<SafetensorsFile> result(new SafetensorsFile());
  result->path_ = path;
  // MAP_PRIVATE with write permission: zero-copy tensors may be written by a careless op without
  // touching the file, and pages stay shared until then.
  void* map = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, file.fd, 0);
  DP_CHECK(map != MAP_FAILED, path, ": mmap of ", file_size, " bytes failed: ", std::strerror(errno));
  result->map_ = map;
  result->map_size_ = file_size;
  result->fd_ = file.fd;  // kept for read(): the same file as the mapping, even if the path is replaced later
  file.fd = -1;
  result->header_ = parse_safetensors_image(std::string_view(static_cast<const char*>(map), file_size), path);
  return result;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo& SafetensorsFile::at(std::string_view name) const {
  const TensorInfo* info = find(name);
  DP_CHECK(info != nullptr, path_, ": no tensor named '", name, "'");
  return *info;
}

const std::byte* SafetensorsFile::data(const TensorInfo& info) const {
  return static_cast<const std::byte*>(map_) + header_.data_offset() + info.begin;
}

void SafetensorsFile::read(const TensorInfo& info, uint64_t offset, uint64_t size, void* out) const {
  DP_CHECK(offset <= info.nbytes() && size <= info.nbytes() - offset, path_, ": bytes [", offset, ", ", offset + size,
           ") are outside a tensor of ", info.nbytes(), " bytes");
  const uint64_t start = header_.data_offset() + info.begin + offset;
  auto* bytes = static_cast<char*>(out);
  uint64_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd_, bytes + done, size - done, static_cast<off_t>(start + done));
    if (got < 0 && errno == EINTR) continue;
    DP_CHECK(got > 0, path_, ": read failed at byte ", start + done, ": ",
             got == 0 ? "the file ends there (truncated after its header was read)" : std::strerror(errno));
    done += static_cast<uint64_t>(got);
  }
}

}  // namespace dp::io
