#pragma once
// `diffpipe inspect --lora FILE [--model DIR [--device-map MAP] [--world-size N] [--max-memory ...]] [--json]`.
#include <string>

namespace dp::cli {

struct LoraInspectOptions {
  std::string path;
  std::string model;       // optional: fit to its configs and number the blocks
  std::string device_map;  // optional, with --model: the split whose ranks are listed ("pipeline" by default)
  std::string max_memory;
  int world_size = 0;  // 0: none given
  bool json = false;
};

// Prints the adapter's layout, ranks, alphas and target modules, and per rank what it reads. Throws naming the
// file and key when the adapter is malformed or does not fit the model.
void inspect_lora(const LoraInspectOptions& options);

}  // namespace dp::cli
