#include "io/hdf5_latents.h"

#include <hdf5.h>

#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/hdf5_support.h"

namespace dp::io {
namespace {

using hdf5::Handle;

struct SilenceHdf5Errors {
  SilenceHdf5Errors() { hdf5::silence_errors(); }
};
const SilenceHdf5Errors silence;

void write_attribute(hid_t target, const std::string& name, double value, const std::string& path) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(target, name.c_str(), H5T_NATIVE_DOUBLE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  DP_CHECK(attr.ok() && H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value) >= 0, path, ": cannot write attribute '",
           name, "'");
}

void write_text_attribute(hid_t target, const std::string& name, const std::string& value, const std::string& path) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(target, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const std::string stored = value.empty() ? std::string(1, '\0') : value;
  DP_CHECK(attr.ok() && H5Awrite(attr.get(), type.get(), stored.data()) >= 0, path, ": cannot write attribute '",
           name, "'");
}

}  // namespace

void write_latents_hdf5(const std::string& path, const LatentsFile& file) {
  DP_CHECK(file.shape.size() == 3, path, ": latents must be (B, seq, C), got rank ", file.shape.size());
  size_t count = 1;
  for (int64_t d : file.shape) {
    DP_CHECK(d > 0, path, ": latents dimension ", d, " must be positive");
    count *= static_cast<size_t>(d);
  }
  DP_CHECK(count == file.values.size(), path, ": shape holds ", count, " values but ", file.values.size(), " given");
  AtomicFile output(path);
  output.write([&](const std::string& tmp) {
    Handle h5(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    DP_CHECK(h5.ok(), path, ": cannot create HDF5 file");
    const hsize_t dims[3] = {static_cast<hsize_t>(file.shape[0]), static_cast<hsize_t>(file.shape[1]),
                             static_cast<hsize_t>(file.shape[2])};
    Handle space(H5Screate_simple(3, dims, nullptr), H5Sclose);
    Handle data(H5Dcreate2(h5.get(), "latents", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose);
    DP_CHECK(data.ok(), path, ": cannot create dataset 'latents'");
    DP_CHECK(H5Dwrite(data.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, file.values.data()) >= 0, path,
             ": cannot write dataset 'latents'");
    for (const auto& [name, value] : file.numeric_attributes) write_attribute(h5.get(), name, value, path);
    for (const auto& [name, value] : file.text_attributes) write_text_attribute(h5.get(), name, value, path);
    DP_CHECK(H5Fflush(h5.get(), H5F_SCOPE_GLOBAL) >= 0, path, ": flush failed");
  });
  output.commit();
}

LatentsFile read_latents_hdf5(const std::string& path) {
  DP_CHECK(std::filesystem::is_regular_file(path), path, ": no such file");
  DP_CHECK(H5Fis_hdf5(path.c_str()) > 0, path, ": not an HDF5 file");
  Handle h5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  DP_CHECK(h5.ok(), path, ": cannot open HDF5 file");
  DP_CHECK(H5Lexists(h5.get(), "latents", H5P_DEFAULT) > 0, path, ": no dataset 'latents'");
  Handle data(H5Dopen2(h5.get(), "latents", H5P_DEFAULT), H5Dclose);
  DP_CHECK(data.ok(), path, ": cannot open dataset 'latents'");
  Handle type(H5Dget_type(data.get()), H5Tclose);
  DP_CHECK(H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4, path,
           ": dataset 'latents' must be float32");
  Handle space(H5Dget_space(data.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  DP_CHECK(rank == 3, path, ": dataset 'latents' must have rank 3 (B, seq, C), has ", rank);
  hsize_t dims[3] = {0, 0, 0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  LatentsFile file;
  size_t count = 1;
  for (hsize_t d : dims) {
    DP_CHECK(d > 0 && d < (hsize_t(1) << 31), path, ": dataset 'latents' has an implausible dimension ", d);
    file.shape.push_back(static_cast<int64_t>(d));
    count *= static_cast<size_t>(d);
  }
  DP_CHECK(count <= (size_t(1) << 32), path, ": dataset 'latents' is implausibly large (", count, " values)");
  file.values.resize(count);
  DP_CHECK(H5Dread(data.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, file.values.data()) >= 0, path,
           ": cannot read dataset 'latents'");
  struct Visit {
    LatentsFile* file;
    const std::string* path;
  } visit{&file, &path};
  auto read_one = [](hid_t location, const char* name, const H5A_info_t*, void* data) -> herr_t {
    auto* v = static_cast<Visit*>(data);
    Handle attr(H5Aopen(location, name, H5P_DEFAULT), H5Aclose);
    if (!attr.ok()) return 0;
    Handle atype(H5Aget_type(attr.get()), H5Tclose);
    Handle aspace(H5Aget_space(attr.get()), H5Sclose);
    if (H5Sget_simple_extent_npoints(aspace.get()) != 1) return 0;  // only scalars carry run facts
    const H5T_class_t kind = H5Tget_class(atype.get());
    if (kind == H5T_STRING && H5Tis_variable_str(atype.get()) <= 0) {
      const size_t size = H5Tget_size(atype.get());
      if (size == 0 || size >= (1u << 20)) return 0;
      std::string value(size, '\0');
      if (H5Aread(attr.get(), atype.get(), value.data()) >= 0) {
        value.resize(value.find('\0') == std::string::npos ? value.size() : value.find('\0'));
        v->file->text_attributes[name] = value;
      }
    } else if (kind == H5T_FLOAT || kind == H5T_INTEGER) {
      double value = 0;
      if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value) >= 0) v->file->numeric_attributes[name] = value;
    }
    return 0;
  };
  hsize_t index = 0;
  DP_CHECK(H5Aiterate2(h5.get(), H5_INDEX_NAME, H5_ITER_INC, &index, read_one, &visit) >= 0, path,
           ": cannot read the file's attributes");
  return file;
}

}  // namespace dp::io
