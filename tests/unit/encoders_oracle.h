#pragma once
// Reading the encoders oracle (tests/reference/cases_encoders.py) and comparing against it: shared by
// models_text_encoders_test and models_vae_test. Header-only because each test executable links only
// its own source and test_support.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/torch_tensors.h"
#include "test_support.h"

namespace dp::test {

// One case folder: OUT/encoders/<case>/{model, io.safetensors}. A missing oracle output throws, which
// fails the test (never skips it).
class OracleCase {
 public:
  explicit OracleCase(const std::string& name)
      : dir_((std::filesystem::path(reference_dir()) / "encoders" / name).string()) {
    const std::string io_path = dir_ + "/io.safetensors";
    DP_CHECK(std::filesystem::exists(io_path), io_path,
             ": oracle output missing; run tests/reference/generate_all.py --only encoders");
    io_ = io::SafetensorsFile::open(io_path);
  }
  std::string path(const std::string& sub) const { return dir_ + "/" + sub; }
  // A copy, converted to dtype, so later in-place use never touches the mapping.
  at::Tensor tensor(const std::string& name, at::ScalarType dtype = at::kFloat) const {
    return io::tensor_view(io_, io_->at(name)).to(dtype, /*non_blocking=*/false, /*copy=*/true);
  }
  at::Tensor tensor_as_stored(const std::string& name) const { return io::tensor_view(io_, io_->at(name)).clone(); }

 private:
  std::string dir_;
  std::shared_ptr<io::SafetensorsFile> io_;
};

inline std::string dtype_suffix(at::ScalarType dtype) { return io::run_dtype_name(dtype); }

// Max abs error relative to max |expected|; prints the measurement so reports can quote it.
inline double expect_close(const std::string& label, const std::string& name, const at::Tensor& actual,
                           const at::Tensor& expected, double tolerance) {
  EXPECT_EQ(actual.sizes(), expected.sizes()) << label << " " << name;
  if (actual.sizes() != expected.sizes()) return -1;
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  const double scale = std::max(e.abs().max().item<double>(), 1e-30);
  const double error = (a - e).abs().max().item<double>();
  const double relative = error / scale;
  std::printf("[measured] %s %s: max_abs_err=%.3e scale=%.3e relative=%.3e (tolerance %.1e)\n", label.c_str(),
              name.c_str(), error, scale, relative, tolerance);
  EXPECT_TRUE(std::isfinite(relative)) << label << " " << name;
  EXPECT_LE(relative, tolerance) << label << " " << name << ": max abs error " << error << " at output scale "
                                 << scale;
  return relative;
}

}  // namespace dp::test
