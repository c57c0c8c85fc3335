#include "io/png_idat.h"

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <future>

#include "core/cpu_affinity.h"
#include "core/error.h"

namespace dp::io {
namespace {

constexpr int kBytesPerPixel = 3;
constexpr size_t kWindow = 32 * 1024;   // deflate's window: the dictionary each band is primed with
constexpr int kMinRowsPerBand = 16;     // below this the per-band overhead outweighs the threads
constexpr int kMaxThreads = 64;

// The Paeth predictor of the PNG specification (section 9.4).
uint8_t paeth(int a, int b, int c) {
  const int p = a + b - c;
  const int pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return static_cast<uint8_t>(a);
  return static_cast<uint8_t>(pb <= pc ? b : c);
}

// Row y filtered five ways; writes the one with the smallest sum of |signed byte| (filter type byte first).
void filter_row(const uint8_t* row, const uint8_t* above, size_t length, uint8_t* out) {
  std::vector<uint8_t> candidate(length);
  uint64_t best_cost = UINT64_MAX;
  for (int type = 0; type < 5; ++type) {
    uint64_t cost = 0;
    for (size_t i = 0; i < length; ++i) {
      const int left = i >= kBytesPerPixel ? row[i - kBytesPerPixel] : 0;
      const int up = above ? above[i] : 0;
      const int up_left = above && i >= kBytesPerPixel ? above[i - kBytesPerPixel] : 0;
      int predicted = 0;
      switch (type) {
        case 1: predicted = left; break;
        case 2: predicted = up; break;
        case 3: predicted = (left + up) / 2; break;
        case 4: predicted = paeth(left, up, up_left); break;
        default: break;
      }
      const auto value = static_cast<uint8_t>(row[i] - predicted);
      candidate[i] = value;
      cost += static_cast<uint64_t>(std::abs(static_cast<int8_t>(value)));
    }
    if (cost < best_cost) {
      best_cost = cost;
      out[0] = static_cast<uint8_t>(type);
      std::copy(candidate.begin(), candidate.end(), out + 1);
    }
  }
}

struct Band {
  std::vector<uint8_t> deflated;  // raw deflate, ending on a sync flush (or the final block, for the last band)
  uLong adler = 0;                // Adler-32 of the band's filtered bytes alone
  size_t filtered_bytes = 0;
};

// Deflates filtered[begin, end) as raw deflate, primed with up to 32 KiB of the bytes before `begin`.
Band deflate_band(const std::vector<uint8_t>& filtered, size_t begin, size_t end, bool last) {
  z_stream z{};
  DP_CHECK(deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK,
           "PNG image data: zlib could not start a deflate stream");
  Band band;
  try {
    if (begin > 0) {
      const size_t primed = std::min(kWindow, begin);
      DP_CHECK(deflateSetDictionary(&z, filtered.data() + begin - primed, static_cast<uInt>(primed)) == Z_OK,
               "PNG image data: zlib refused the band's dictionary");
    }
    band.filtered_bytes = end - begin;
    band.adler = adler32(adler32(0L, Z_NULL, 0), filtered.data() + begin, static_cast<uInt>(end - begin));
    band.deflated.resize(deflateBound(&z, static_cast<uLong>(end - begin)) + 16);
    z.next_in = const_cast<Bytef*>(filtered.data() + begin);
    z.avail_in = static_cast<uInt>(end - begin);
    z.next_out = band.deflated.data();
    z.avail_out = static_cast<uInt>(band.deflated.size());
    const int status = deflate(&z, last ? Z_FINISH : Z_SYNC_FLUSH);
    DP_CHECK((last ? status == Z_STREAM_END : status == Z_OK) && z.avail_in == 0,
             "PNG image data: deflate stopped early (zlib status ", status, ")");
    band.deflated.resize(band.deflated.size() - z.avail_out);
  } catch (...) {
    deflateEnd(&z);
    throw;
  }
  deflateEnd(&z);
  return band;
}

}  // namespace

std::vector<uint8_t> png_rgb_image_data(const std::vector<uint8_t>& pixels, int width, int height, int threads) {
  DP_CHECK(width > 0 && height > 0, "PNG image data: invalid image size ", width, "x", height);
  const size_t row_bytes = static_cast<size_t>(width) * kBytesPerPixel;
  DP_CHECK(pixels.size() == row_bytes * static_cast<size_t>(height), "PNG image data: expected ",
           row_bytes * static_cast<size_t>(height), " bytes of RGB, got ", pixels.size());
  // zlib's counters are 32-bit; a band stays far below that, the whole image may not.
  DP_CHECK(row_bytes + 1 < (1u << 30), "PNG image data: rows of ", width, " pixels are too wide");
  // The machine's count, not the process's CPU affinity: the bands, and so the file's bytes, follow the count, and
  // a rank that a launcher bound to one core must write the same PNG as one process does.
  if (threads <= 0) threads = machine_cpus();
  threads = std::min(threads, kMaxThreads);
  const int rows_per_band = std::max(kMinRowsPerBand, (height + threads - 1) / threads);
  const int bands = (height + rows_per_band - 1) / rows_per_band;  // every band holds at least one row

  // Two passes over the bands, each on every thread: filtering (a row needs only the raw row above it), then
  // deflating (a band's dictionary is the filtered bytes before it).
  const size_t filtered_row = row_bytes + 1;
  std::vector<uint8_t> filtered(filtered_row * static_cast<size_t>(height));
  const auto band_rows = [&](int b) {
    const int first = b * rows_per_band;
    return std::make_pair(first, std::min(height, first + rows_per_band));
  };
  std::vector<std::future<void>> filtering;
  for (int b = 0; b < bands; ++b) {
    filtering.push_back(std::async(std::launch::async, [&, b] {
      const auto [first, last] = band_rows(b);
      for (int y = first; y < last; ++y)
        filter_row(pixels.data() + static_cast<size_t>(y) * row_bytes,
                   y > 0 ? pixels.data() + static_cast<size_t>(y - 1) * row_bytes : nullptr, row_bytes,
                   filtered.data() + static_cast<size_t>(y) * filtered_row);
    }));
  }
  for (auto& f : filtering) f.get();
  std::vector<std::future<Band>> deflating;
  for (int b = 0; b < bands; ++b) {
    const auto [first, last] = band_rows(b);
    deflating.push_back(std::async(std::launch::async, deflate_band, std::cref(filtered),
                                   static_cast<size_t>(first) * filtered_row,
                                   static_cast<size_t>(last) * filtered_row, b == bands - 1));
  }
  std::vector<Band> done;
  for (auto& d : deflating) done.push_back(d.get());

  // zlib's header for a 32 KiB window at the default level (0x78 0x9c), the bands, then the Adler-32 of all.
  std::vector<uint8_t> stream = {0x78, 0x9c};
  uLong adler = adler32(0L, Z_NULL, 0);
  for (const Band& band : done) {
    stream.insert(stream.end(), band.deflated.begin(), band.deflated.end());
    adler = adler32_combine(adler, band.adler, static_cast<z_off_t>(band.filtered_bytes));
  }
  for (int shift = 24; shift >= 0; shift -= 8) stream.push_back(static_cast<uint8_t>((adler >> shift) & 0xff));
  return stream;
}

}  // namespace dp::io
