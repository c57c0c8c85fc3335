#pragma once
// Packed latents in HDF5, as `generate --output-type latent` writes them and checkpoints will: dataset
// `latents` (float32, (B, seq, C)) plus scalar attributes. Files are written to a temp name and renamed,
// so a crash never leaves a half-written file under the real name.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dp::io {

struct LatentsFile {
  std::vector<int64_t> shape;  // (B, seq, C)
  std::vector<float> values;   // row-major
  std::map<std::string, double> numeric_attributes;  // height, width, seed, steps, guidance ...
  std::map<std::string, std::string> text_attributes;
};

void write_latents_hdf5(const std::string& path, const LatentsFile& file);
// Validates the dataset's type, rank and size against what the header claims; errors name the file.
LatentsFile read_latents_hdf5(const std::string& path);

}  // namespace dp::io
