#pragma once
// 8-bit RGB PNG output: libpng writes the header and text chunks, the image data is compressed on every core
// (io/png_idat.h).
#include <cstdint>
#include <string>
#include <vector>

#include "io/png_text.h"

namespace dp::io {

// `pixels` is height*width*3 bytes, row-major RGB. Written atomically (temp file, then rename). `text` goes
// into chunks before the image data: tEXt when the value is plain ASCII, else iTXt (UTF-8), uncompressed, so
// that any PNG reader shows it.
void write_png_rgb(const std::string& path, const std::vector<uint8_t>& pixels, int width, int height,
                   const std::vector<PngText>& text = {});
// Reads an 8-bit RGB or RGBA PNG back (tests, PSNR checks); alpha is dropped.
std::vector<uint8_t> read_png_rgb(const std::string& path, int* width, int* height);

}  // namespace dp::io
