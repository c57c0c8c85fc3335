// PNG and HDF5 outputs: round trips, and clear errors on files that are not what they claim.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/hdf5_latents.h"
#include "io/png_image.h"
#include "test_support.h"

namespace dp::io {
namespace {

TEST(PngImage, RoundTrips) {
  const auto dir = dp::test::temp_dir("png");
  std::vector<uint8_t> pixels(5 * 3 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  write_png_rgb(dir + "/a.png", pixels, 5, 3);
  int w = 0, h = 0;
  EXPECT_EQ(read_png_rgb(dir + "/a.png", &w, &h), pixels);
  EXPECT_EQ(w, 5);
  EXPECT_EQ(h, 3);
  EXPECT_THROW(write_png_rgb(dir + "/b.png", pixels, 4, 3), dp::Error);
  dp::test::write_file(dir + "/c.png", "not a png");
  EXPECT_THROW(read_png_rgb(dir + "/c.png", &w, &h), dp::Error);
  EXPECT_THROW(write_png_rgb(dir + "/missing/d.png", pixels, 5, 3), dp::Error);
}

TEST(Hdf5Latents, RoundTripsWithAttributes) {
  const auto dir = dp::test::temp_dir("h5");
  LatentsFile file;
  file.shape = {2, 3, 4};
  for (int i = 0; i < 24; ++i) file.values.push_back(0.5f * static_cast<float>(i) - 3.0f);
  file.numeric_attributes = {{"height", 256}, {"width", 512}, {"seed", 42}, {"steps", 4}, {"guidance", 3.5}};
  file.text_attributes = {{"prompt", "a cat"}};
  write_latents_hdf5(dir + "/l.h5", file);
  const LatentsFile back = read_latents_hdf5(dir + "/l.h5");
  EXPECT_EQ(back.shape, file.shape);
  EXPECT_EQ(back.values, file.values);
  EXPECT_EQ(back.numeric_attributes, file.numeric_attributes);
  EXPECT_EQ(back.text_attributes.at("prompt"), "a cat");
}

TEST(Hdf5Latents, RejectsBadInputs) {
  const auto dir = dp::test::temp_dir("h5bad");
  LatentsFile file;
  file.shape = {1, 2};
  EXPECT_THROW(write_latents_hdf5(dir + "/a.h5", file), dp::Error);
  file.shape = {1, 2, 2};
  file.values = {1, 2, 3};
  EXPECT_THROW(write_latents_hdf5(dir + "/a.h5", file), dp::Error);
  dp::test::write_file(dir + "/b.h5", "garbage");
  try {
    read_latents_hdf5(dir + "/b.h5");
    ADD_FAILURE() << "accepted a non-HDF5 file";
  } catch (const dp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not an HDF5 file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_latents_hdf5(dir + "/missing.h5"), dp::Error);
}

}  // namespace
}  // namespace dp::io
