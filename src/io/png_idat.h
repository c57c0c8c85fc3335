#pragma once
// A PNG's image data (the zlib stream its IDAT chunks carry) for 8-bit RGB rows, compressed in bands of rows on
// several threads. One thread with libpng took 130-190 ms for a 1024x1024 image on the GPU machine, after a
// denoising loop that leaves every core idle (bench/RESULTS.md, 2026-12-05). Each band is deflated on its own,
// primed with the 32 KiB of filtered rows before it, and ends on a byte boundary (a sync flush); the bands'
// Adler-32 sums are combined, so the result is one ordinary zlib stream that any PNG reader takes.
#include <cstdint>
#include <vector>

namespace dp::io {

// The zlib stream of `pixels` (height rows of width*3 bytes): each row filtered with the PNG filter whose
// output has the smallest sum of absolute values (libpng's default heuristic), then deflated at zlib's default
// level. `threads` 0 means the machine's hardware threads; the bytes do not depend on it beyond the band count.
std::vector<uint8_t> png_rgb_image_data(const std::vector<uint8_t>& pixels, int width, int height, int threads = 0);

}  // namespace dp::io
