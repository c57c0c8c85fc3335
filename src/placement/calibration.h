#pragma once
// Measured block times (`diffpipe calibrate`): what one double block, one single block, the embedders and the
// output layers cost on a named device, in a dtype, at one shape and microbatch size. The "pipeline" split and
// the simulator plan from them instead of FLOP-scaled estimates when a run matches an entry exactly: the FLOP
// model misses that single blocks and double blocks reach different GEMM efficiencies, and that a small
// microbatch costs more per image than a large one.
//
// The file is JSON, written by `diffpipe calibrate` and read by plan and generate:
//   {"format": "diffpipe-calibration", "version": 1,
//    "entries": [{"device": "NVIDIA H200", "dtype": "bf16", "height": 1024, "width": 1024, "text_tokens": 512,
//                 "microbatch": 1, "embedders_ms": 0.2, "double_block_ms": 3.1, "single_block_ms": 2.9,
//                 "output_ms": 0.1, "runs": 5}]}
// It is read defensively (size bound, duplicate keys refused, every field checked): a malformed file throws
// naming the file and the field; an entry for another key is not used, and find_calibration says why.
#include <optional>
#include <string>
#include <vector>

namespace dp::placement {

struct CalibrationKey {
  std::string device;  // GPU name (cudaDeviceProp::name) or "cpu (N threads)"
  std::string dtype;   // bf16, fp16, fp32
  int64_t height = 0, width = 0, text_tokens = 0, microbatch = 0;
  bool operator==(const CalibrationKey& o) const {
    return device == o.device && dtype == o.dtype && height == o.height && width == o.width &&
           text_tokens == o.text_tokens && microbatch == o.microbatch;
  }
};

// Milliseconds for one forward of each unit on a whole microbatch (not per image).
struct CalibratedTimes {
  double embedders_ms = 0, double_block_ms = 0, single_block_ms = 0, output_ms = 0;
};

struct CalibrationEntry {
  CalibrationKey key;
  CalibratedTimes times;
  int runs = 0;  // timed runs each median was taken over
};

constexpr const char* kCalibrationFormat = "diffpipe-calibration";
constexpr int kCalibrationVersion = 1;

// "NVIDIA H200, bf16, 1024x1024, 512 text tokens, microbatch 2"
std::string describe_key(const CalibrationKey& key);

// Where calibrate writes and plan/generate look when no --calibration is given: $DIFFPIPE_CALIBRATION, else
// $XDG_CACHE_HOME/diffpipe/calibration.json, else ~/.cache/diffpipe/calibration.json.
std::string default_calibration_path();

// Throws dp::Error naming the file and the field at fault.
std::vector<CalibrationEntry> read_calibration(const std::string& path);
// Adds `entries` to the file (creating it), replacing entries of the same key; written atomically.
void write_calibration(const std::string& path, const std::vector<CalibrationEntry>& entries);

struct CalibrationMatch {
  std::optional<CalibrationEntry> entry;
  std::string reason;  // why nothing matched (empty on a match)
};

// The entry of exactly `key`. An empty key.device matches any device when only one device has an entry of the
// rest of the key (plan, which runs on no device); several such devices: no match, the reason lists them.
CalibrationMatch find_calibration(const std::vector<CalibrationEntry>& entries, const CalibrationKey& key);

// What plan and generate plan from. `path` empty: the default file, used when it exists and matches (a damaged
// default file is not used, and `message` says why, rather than failing the run); `path` given: it must exist
// and parse (throws otherwise), and when no entry matches the run the FLOP model is used and `message` says why.
struct CalibrationChoice {
  std::optional<CalibrationEntry> entry;
  std::string path;     // the file read (or looked for)
  std::string source;   // "FILE (key)" when calibrated
  std::string message;  // one line for the user: which times the plan comes from, and why
  std::vector<CalibrationEntry> entries;  // everything the file held (for the efficiency curve)
};
CalibrationChoice choose_calibration(const std::string& path, const CalibrationKey& key);

// Per-image cost of each calibrated microbatch size relative to the best one, for a device/dtype/shape
// (key.microbatch ignored): {microbatch, efficiency in (0, 1]}, ascending in microbatch. Empty when fewer
// than two sizes were calibrated.
std::vector<std::pair<int64_t, double>> calibrated_efficiency_curve(const std::vector<CalibrationEntry>& entries,
                                                                    const CalibrationKey& key);

}  // namespace dp::placement
