// PNG and HDF5 outputs: round trips, and clear errors on files that are not what they claim.
#include <gtest/gtest.h>

#include "bind_one_cpu.h"
#include "core/error.h"
#include "io/hdf5_latents.h"
#include "io/png_idat.h"
#include "io/png_image.h"
#include "io/png_text.h"
#include "test_support.h"

#include <zlib.h>

#include <cstdlib>
#include <random>
#include <thread>

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

// An image with smooth parts (which the PNG filters shrink), noise (which they cannot) and flat runs.
std::vector<uint8_t> test_picture(int width, int height) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * 3);
  std::mt19937 random(7);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) {
        const size_t i = (static_cast<size_t>(y) * width + x) * 3 + c;
        pixels[i] = x < width / 3   ? static_cast<uint8_t>(x * 2 + y + c * 40)
                    : x < width / 2 ? static_cast<uint8_t>(random() & 0xff)
                                    : static_cast<uint8_t>(y / 8 * 8);
      }
  return pixels;
}

// The PNG specification's reconstruction (section 9), written out independently of the encoder.
std::vector<uint8_t> unfilter(const std::vector<uint8_t>& filtered, int width, int height) {
  const size_t row = static_cast<size_t>(width) * 3;
  std::vector<uint8_t> out(row * height);
  for (int y = 0; y < height; ++y) {
    const uint8_t type = filtered[y * (row + 1)];
    const uint8_t* in = &filtered[y * (row + 1) + 1];
    uint8_t* now = &out[y * row];
    const uint8_t* up = y > 0 ? &out[(y - 1) * row] : nullptr;
    EXPECT_LE(type, 4) << "row " << y;
    for (size_t i = 0; i < row; ++i) {
      const int a = i >= 3 ? now[i - 3] : 0, b = up ? up[i] : 0, c = up && i >= 3 ? up[i - 3] : 0;
      const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
      const int predictor[5] = {0, a, b, (a + b) / 2, pa <= pb && pa <= pc ? a : (pb <= pc ? b : c)};
      now[i] = static_cast<uint8_t>(in[i] + predictor[type]);
    }
  }
  return out;
}

TEST(PngImage, BandsOnAnyThreadCountInflateToTheImage) {
  for (const auto& [width, height] : std::vector<std::pair<int, int>>{{1, 1}, {7, 3}, {301, 257}, {64, 1000}}) {
    const auto pixels = test_picture(width, height);
    size_t one_band = 0;
    for (int threads : {1, 3, 16, 64}) {
      SCOPED_TRACE(testing::Message() << width << "x" << height << " on " << threads << " thread(s)");
      const auto stream = png_rgb_image_data(pixels, width, height, threads);
      // uncompress checks the zlib header and the combined Adler-32 as well as the deflate data.
      std::vector<uint8_t> filtered(static_cast<size_t>(width * 3 + 1) * height + 1);
      uLongf length = filtered.size();
      ASSERT_EQ(uncompress(filtered.data(), &length, stream.data(), stream.size()), Z_OK);
      ASSERT_EQ(length, static_cast<uLongf>(width * 3 + 1) * height);
      filtered.resize(length);
      EXPECT_EQ(unfilter(filtered, width, height), pixels);
      // Bands primed with the bytes before them compress about as well as one stream (each band adds its own
      // block headers and Huffman tables, a hundred bytes or so).
      if (threads == 1) one_band = stream.size();
      EXPECT_LE(stream.size(), one_band + one_band / 50 + 128 * static_cast<size_t>(threads));
    }
  }
  EXPECT_THROW(png_rgb_image_data(std::vector<uint8_t>(10), 2, 2), dp::Error);
  EXPECT_THROW(png_rgb_image_data({}, 0, 1), dp::Error);
}

// A rank that a launcher bound to one core (Open MPI's default for two ranks) writes the bytes one unbound
// process writes: the default band count follows the machine, not the affinity mask.
TEST(PngImage, AThreadBoundToOneCpuWritesTheSameBytes) {
  const auto pixels = test_picture(301, 257);
  const auto unbound = png_rgb_image_data(pixels, 301, 257);
  std::vector<uint8_t> bound;
  std::thread writer([&] {
    ASSERT_GE(test::bind_this_thread_to_one_cpu(), 0);
    bound = png_rgb_image_data(pixels, 301, 257);
  });
  writer.join();
  EXPECT_EQ(bound, unbound);
}

TEST(PngImage, LargeImageWithTextRoundTripsThroughLibpng) {
  const auto dir = dp::test::temp_dir("png-large");
  const auto pixels = test_picture(513, 300);
  write_png_rgb(dir + "/a.png", pixels, 513, 300, {{"prompt", "a cat, \u00e9t\u00e9"}, {"seed", "7"}});
  int w = 0, h = 0;
  EXPECT_EQ(read_png_rgb(dir + "/a.png", &w, &h), pixels);
  EXPECT_EQ(w, 513);
  EXPECT_EQ(h, 300);
  const auto text = read_png_text(dir + "/a.png");
  ASSERT_EQ(text.size(), 2u);
  EXPECT_EQ(text[0].key, "prompt");
  EXPECT_EQ(text[0].value, "a cat, \u00e9t\u00e9");
  EXPECT_EQ(text[1].value, "7");
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
