#include "io/png_image.h"

#include <png.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/png_idat.h"

namespace dp::io {
namespace {

constexpr size_t kIdatChunkBytes = 1 << 20;  // any size up to 2^31-1 is valid; readers stream them alike

struct File {
  FILE* handle = nullptr;
  ~File() {
    if (handle) std::fclose(handle);
  }
};

[[noreturn]] void png_failure(png_structp png, png_const_charp message) {
  // libpng needs a non-returning handler; we unwind with the message instead of longjmp.
  throw std::runtime_error(message ? message : "libpng error");
}

}  // namespace

void write_png_rgb(const std::string& path, const std::vector<uint8_t>& pixels, int width, int height,
                   const std::vector<PngText>& text) {
  DP_CHECK(width > 0 && height > 0, path, ": invalid image size ", width, "x", height);
  for (const auto& t : text)
    DP_CHECK(valid_png_keyword(t.key) && fits_png_text_chunk(t.key), path, ": PNG text key '", t.key,
             "' is not a PNG keyword (1-79 printable ASCII characters)");
  DP_CHECK(pixels.size() == static_cast<size_t>(width) * height * 3, path, ": expected ", width * height * 3,
           " bytes of RGB, got ", pixels.size());
  AtomicFile output(path);
  output.write([&](const std::string& tmp) {
    File file;
    file.handle = std::fopen(tmp.c_str(), "wb");
    DP_CHECK(file.handle != nullptr, tmp, ": cannot open for writing");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, png_failure, nullptr);
    png_infop info = png ? png_create_info_struct(png) : nullptr;
    DP_CHECK(png && info, path, ": libpng could not allocate");
    try {
      png_init_io(png, file.handle);
      png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                   PNG_FILTER_TYPE_DEFAULT);
      // libpng keeps pointers into `text` until png_write_info has written the chunks.
      std::vector<png_text> chunks(text.size());
      for (size_t i = 0; i < text.size(); ++i) {
        const bool ascii = fits_png_text_chunk(text[i].value);
        chunks[i].compression = ascii ? PNG_TEXT_COMPRESSION_NONE : PNG_ITXT_COMPRESSION_NONE;
        chunks[i].key = const_cast<png_charp>(text[i].key.c_str());
        chunks[i].text = const_cast<png_charp>(text[i].value.c_str());
        if (ascii) chunks[i].text_length = text[i].value.size();
        else chunks[i].itxt_length = text[i].value.size();
        chunks[i].lang = nullptr;
        chunks[i].lang_key = nullptr;
      }
      if (!chunks.empty()) png_set_text(png, info, chunks.data(), static_cast<int>(chunks.size()));
      png_write_info(png, info);
      // The image data comes compressed on every core (io/png_idat.h); libpng frames it as IDAT chunks.
      const std::vector<uint8_t> data = png_rgb_image_data(pixels, width, height);
      for (size_t at = 0; at < data.size(); at += kIdatChunkBytes)
        png_write_chunk(png, reinterpret_cast<png_const_bytep>("IDAT"), data.data() + at,
                        std::min(kIdatChunkBytes, data.size() - at));
      png_write_chunk(png, reinterpret_cast<png_const_bytep>("IEND"), nullptr, 0);
    } catch (const std::exception& e) {
      const int saved = errno;  // libpng says "Write Error"; the cause is in errno
      png_destroy_write_struct(&png, &info);
      errno = saved;
      DP_FAIL(path, ": PNG write failed: ", e.what(), saved != 0 ? str(" (", std::strerror(saved), ")") : "");
    }
    png_destroy_write_struct(&png, &info);
    if (std::fflush(file.handle) != 0) {
      const int saved = errno;
      DP_FAIL(path, ": write failed (", std::strerror(saved), ")");
    }
  });
  output.commit();
}

std::vector<uint8_t> read_png_rgb(const std::string& path, int* width, int* height) {
  File file;
  file.handle = std::fopen(path.c_str(), "rb");
  DP_CHECK(file.handle != nullptr, path, ": cannot open");
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, png_failure, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  DP_CHECK(png && info, path, ": libpng could not allocate");
  std::vector<uint8_t> pixels;
  try {
    png_init_io(png, file.handle);
    png_read_info(png, info);
    *width = static_cast<int>(png_get_image_width(png, info));
    *height = static_cast<int>(png_get_image_height(png, info));
    const int color = png_get_color_type(png, info);
    DP_CHECK(png_get_bit_depth(png, info) == 8 && (color == PNG_COLOR_TYPE_RGB || color == PNG_COLOR_TYPE_RGBA),
             path, ": only 8-bit RGB/RGBA PNGs are supported");
    if (color == PNG_COLOR_TYPE_RGBA) png_set_strip_alpha(png);
    png_read_update_info(png, info);
    pixels.resize(static_cast<size_t>(*width) * *height * 3);
    for (int y = 0; y < *height; ++y) png_read_row(png, pixels.data() + static_cast<size_t>(y) * *width * 3, nullptr);
  } catch (const dp::Error&) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw;
  } catch (const std::exception& e) {
    png_destroy_read_struct(&png, &info, nullptr);
    DP_FAIL(path, ": PNG read failed: ", e.what());
  }
  png_destroy_read_struct(&png, &info, nullptr);
  return pixels;
}

}  // namespace dp::io
