#pragma once
// Small helpers shared by the HDF5 files diffpipe writes and reads (latents, checkpoints, embedding caches).
#include <hdf5.h>

namespace dp::io::hdf5 {

// Closes an HDF5 handle with the matching close function.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its own error stack to stderr; diffpipe reports failures itself, with context.
inline void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

}  // namespace dp::io::hdf5
