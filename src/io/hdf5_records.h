#pragma once
// Records in HDF5 files diffpipe writes and reads back (checkpoints, the prompt-embedding cache): scalar
// attributes, datasets, tensors as bytes with a dtype attribute, and a defensive reader that checks types,
// ranks and sizes before it allocates. Internal to io.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint_file.h"
#include "io/hdf5_support.h"

namespace dp::io::hdf5 {

// Bounds on what a file may claim before anything is allocated: a hostile or damaged header must not make
// the reader allocate terabytes. They are far above any real run (256 images, 1000 steps, 512 tokens).
inline constexpr int64_t kMaxDimension = int64_t(1) << 24;
inline constexpr uint64_t kMaxDatasetBytes = uint64_t(1) << 36;  // 64 GiB
inline constexpr size_t kMaxStringBytes = size_t(1) << 20;

inline std::string format_double(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + ")";
}

// A 64-bit digest over bytes, eight at a time: it detects torn and flipped data, it is not a security
// measure (a checkpoint is as trusted as the directory it lies in).
struct Digest {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  void mix(uint64_t word) {
    h ^= word;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
  }
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    mix(n);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      mix(word);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);
    mix(tail);
  }
  void add(const std::string& text) { add(text.data(), text.size()); }
  std::string hex() const {
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
    return out;
  }
};

// --- writing -----------------------------------------------------------------------------------------------

inline void write_number(hid_t target, const std::string& name, double value, const std::string& path) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(target, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  DP_CHECK(attr.ok() && H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value) >= 0, path, ": cannot write attribute '",
           name, "'");
}

inline void write_text(hid_t target, const std::string& name, const std::string& value, const std::string& path) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(target, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const std::string stored = value.empty() ? std::string(1, '\0') : value;
  DP_CHECK(attr.ok() && H5Awrite(attr.get(), type.get(), stored.data()) >= 0, path, ": cannot write attribute '",
           name, "'");
}

inline void write_dataset(hid_t file, const std::string& name, hid_t file_type, hid_t memory_type,
                   const std::vector<int64_t>& shape, const void* data, const std::string& path,
                   const std::string& dtype_attribute = "") {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Handle set(H5Dcreate2(file, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  DP_CHECK(set.ok(), path, ": cannot create dataset '", name, "'");
  DP_CHECK(H5Dwrite(set.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0, path,
           ": cannot write dataset '", name, "'");
  if (!dtype_attribute.empty()) write_text(set.get(), "dtype", dtype_attribute, path);
}

inline void write_tensor(hid_t file, const std::string& name, const RawTensor& t, const std::string& path) {
  DP_CHECK(t.nbytes == static_cast<size_t>(t.numel()) * dtype_bytes(t.dtype), path, ": tensor '", name, "' ",
           shape_text(t.shape), " ", t.dtype, " has ", t.nbytes, " bytes");
  // bf16 has no HDF5 type h5py knows: 16-bit types are stored as their bits, the attribute names the dtype.
  if (t.dtype == "fp32")
    write_dataset(file, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, t.shape, t.data, path, t.dtype);
  else
    write_dataset(file, name, H5T_STD_U16LE, H5T_NATIVE_UINT16, t.shape, t.data, path, t.dtype);
}

// --- reading -----------------------------------------------------------------------------------------------

struct Reader {
  std::string path;
  hid_t file;

  bool has(const std::string& name) const { return H5Lexists(file, name.c_str(), H5P_DEFAULT) > 0; }
  bool has_attribute(const std::string& name) const { return H5Aexists(file, name.c_str()) > 0; }

  double number(const std::string& name) const {
    DP_CHECK(H5Aexists(file, name.c_str()) > 0, path, ": attribute '", name, "' is missing");
    Handle attr(H5Aopen(file, name.c_str(), H5P_DEFAULT), H5Aclose);
    Handle type(H5Aget_type(attr.get()), H5Tclose);
    Handle space(H5Aget_space(attr.get()), H5Sclose);
    const H5T_class_t kind = H5Tget_class(type.get());
    DP_CHECK(attr.ok() && (kind == H5T_FLOAT || kind == H5T_INTEGER) && H5Sget_simple_extent_npoints(space.get()) == 1,
             path, ": attribute '", name, "' must be a number");
    double value = 0;
    DP_CHECK(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value) >= 0 && std::isfinite(value), path, ": attribute '",
             name, "' cannot be read as a finite number");
    return value;
  }

  int64_t integer(const std::string& name, int64_t low, int64_t high) const {
    const double value = number(name);
    DP_CHECK(value == std::floor(value) && value >= static_cast<double>(low) && value <= static_cast<double>(high),
             path, ": attribute '", name, "' is ", format_double(value), ", expected an integer in [", low, ", ", high,
             "]");
    return static_cast<int64_t>(value);
  }

  std::string text(const std::string& name) const {
    DP_CHECK(H5Aexists(file, name.c_str()) > 0, path, ": attribute '", name, "' is missing");
    Handle attr(H5Aopen(file, name.c_str(), H5P_DEFAULT), H5Aclose);
    Handle type(H5Aget_type(attr.get()), H5Tclose);
    Handle space(H5Aget_space(attr.get()), H5Sclose);
    DP_CHECK(attr.ok() && H5Tget_class(type.get()) == H5T_STRING && H5Tis_variable_str(type.get()) == 0 &&
                 H5Sget_simple_extent_npoints(space.get()) == 1,
             path, ": attribute '", name, "' must be a fixed-length string");
    const size_t size = H5Tget_size(type.get());
    DP_CHECK(size >= 1 && size <= kMaxStringBytes, path, ": attribute '", name, "' has an implausible size ", size);
    std::string value(size, '\0');
    DP_CHECK(H5Aread(attr.get(), type.get(), value.data()) >= 0, path, ": cannot read attribute '", name, "'");
    const auto end = value.find('\0');
    if (end != std::string::npos) value.resize(end);
    return value;
  }

  // Opens a dataset and checks its rank; returns its dims.
  std::vector<int64_t> dims_of(hid_t set, const std::string& name, int rank) const {
    Handle space(H5Dget_space(set), H5Sclose);
    const int actual = H5Sget_simple_extent_ndims(space.get());
    DP_CHECK(actual == rank, path, ": dataset '", name, "' has rank ", actual, ", expected ", rank);
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    std::vector<int64_t> shape;
    for (hsize_t d : dims) {
      DP_CHECK(d >= 1 && d <= static_cast<hsize_t>(kMaxDimension), path, ": dataset '", name,
               "' has an implausible dimension ", d);
      shape.push_back(static_cast<int64_t>(d));
    }
    return shape;
  }

  // A dataset of `rank` dimensions whose file type is `kind` of `element_size` bytes, read as memory_type.
  std::vector<uint8_t> read(const std::string& name, int rank, H5T_class_t kind, size_t element_size,
                            hid_t memory_type, std::vector<int64_t>& shape) const {
    DP_CHECK(has(name), path, ": dataset '", name, "' is missing");
    Handle set(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
    DP_CHECK(set.ok(), path, ": cannot open dataset '", name, "'");
    Handle type(H5Dget_type(set.get()), H5Tclose);
    DP_CHECK(H5Tget_class(type.get()) == kind && H5Tget_size(type.get()) == element_size, path, ": dataset '", name,
             "' has the wrong element type (expected ", kind == H5T_FLOAT ? "float" : "integer", " of ", element_size,
             " bytes)");
    shape = dims_of(set.get(), name, rank);
    uint64_t count = 1;
    for (int64_t d : shape) count *= static_cast<uint64_t>(d);  // each <= 2^24, rank <= 3: no overflow
    DP_CHECK(count * element_size <= kMaxDatasetBytes, path, ": dataset '", name, "' is implausibly large (",
             count, " values)");
    std::vector<uint8_t> bytes(static_cast<size_t>(count * element_size));
    DP_CHECK(H5Dread(set.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) >= 0, path,
             ": cannot read dataset '", name, "' (truncated or damaged file?)");
    return bytes;
  }

  std::string dataset_dtype(const std::string& name) const {
    Handle set(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
    DP_CHECK(set.ok() && H5Aexists(set.get(), "dtype") > 0, path, ": dataset '", name, "' has no 'dtype' attribute");
    Reader sub{path + ":" + name, set.get()};
    return sub.text("dtype");
  }

  RawTensor tensor(const std::string& name, int rank) const {
    const std::string dtype = dataset_dtype(name);
    DP_CHECK(dtype == "fp32" || dtype == "bf16" || dtype == "fp16", path, ": dataset '", name, "' has dtype '",
             dtype, "'; expected fp32, bf16 or fp16");
    std::vector<int64_t> shape;
    auto bytes = dtype == "fp32" ? read(name, rank, H5T_FLOAT, 4, H5T_NATIVE_FLOAT, shape)
                                 : read(name, rank, H5T_INTEGER, 2, H5T_NATIVE_UINT16, shape);
    return RawTensor::owning(dtype, shape, std::move(bytes));
  }

  std::vector<std::string> strings(const std::string& name) const {
    DP_CHECK(has(name), path, ": dataset '", name, "' is missing");
    Handle set(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
    Handle type(H5Dget_type(set.get()), H5Tclose);
    DP_CHECK(set.ok() && H5Tget_class(type.get()) == H5T_STRING && H5Tis_variable_str(type.get()) == 0, path,
             ": dataset '", name, "' must hold fixed-length strings");
    const size_t size = H5Tget_size(type.get());
    const auto shape = dims_of(set.get(), name, 1);
    DP_CHECK(size >= 1 && size <= kMaxStringBytes && static_cast<uint64_t>(shape[0]) * size <= kMaxDatasetBytes, path,
             ": dataset '", name, "' is implausibly large");
    std::string all(static_cast<size_t>(shape[0]) * size, '\0');
    DP_CHECK(H5Dread(set.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()) >= 0, path,
             ": cannot read dataset '", name, "'");
    std::vector<std::string> out;
    for (int64_t i = 0; i < shape[0]; ++i) {
      std::string s = all.substr(static_cast<size_t>(i) * size, size);
      const auto end = s.find('\0');
      if (end != std::string::npos) s.resize(end);
      out.push_back(s);
    }
    return out;
  }
};

template <typename T>
std::vector<T> as_vector(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace dp::io::hdf5
