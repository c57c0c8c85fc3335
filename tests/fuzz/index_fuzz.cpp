// libFuzzer target over the sharded-index path (dp::io::WeightIndex::open_dir with a
// *.safetensors.index.json). The input bytes become the index file in a scratch folder that also holds two
// small valid shards, a non-safetensors file and a subfolder, so that an index may point at good shards,
// at garbage, at a directory, or (rejected) outside the folder.
//
// As in safetensors_fuzz.cpp only dp::Error is an acceptable rejection, and an accepted index is checked
// against what callers rely on: every name resolves to a tensor of that name inside one of the shards.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "core/error.h"
#include "fuzz_verdict.h"
#include "io/weight_index.h"

namespace fs = std::filesystem;

namespace {

[[noreturn]] void invariant_failed(const char* what, const std::string& detail) {
  std::fprintf(stderr, "index_fuzz: accepted index breaks invariant: %s (%s)\n", what, detail.c_str());
  std::abort();
}

#define FUZZ_REQUIRE(cond, detail)                  \
  do {                                              \
    if (!(cond)) invariant_failed(#cond, (detail)); \
  } while (0)

const char kIndexName[] = "model.safetensors.index.json";
const char kShard1[] = "model-00001-of-00002.safetensors";
const char kShard2[] = "model-00002-of-00002.safetensors";

void write_file(const fs::path& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::abort();  // the harness itself is broken; never report this as a parser result
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

std::string shard_image(const std::string& json, std::size_t data_bytes) {
  std::string image(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) image[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return image + json + std::string(data_bytes, '\x02');
}

struct Scratch {
  fs::path dir;
  Scratch() {
    // tmpfs when available: one file write per execution should not touch a disk.
    std::string pattern = (fs::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                                                                                           : fs::temp_directory_path().string()) +
                          "/dp_index_fuzz.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    dir = pattern;
    write_file(dir / kShard1, shard_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                          R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})",
                                          11));
    write_file(dir / kShard2, shard_image(R"({"c":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
                                          R"("__metadata__":{"format":"pt"}})",
                                          2));
    write_file(dir / "notes.txt", "not a safetensors file\n");
    fs::create_directory(dir / "sub");
  }
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Scratch scratch;  // built once per process; removed at exit
  write_file(scratch.dir / kIndexName, std::string(reinterpret_cast<const char*>(data), size));
  const std::string dir = scratch.dir.string();
  try {
    const auto index = dp::io::WeightIndex::open_dir(dir);
    const std::set<std::string> shards = {(scratch.dir / kShard1).string(), (scratch.dir / kShard2).string()};
    FUZZ_REQUIRE(index.size() == index.names().size(), dir);
    FUZZ_REQUIRE(index.size() > 0, dir);
    uint64_t total = 0;
    for (const auto& name : index.names()) {
      FUZZ_REQUIRE(index.contains(name), name);
      FUZZ_REQUIRE(index.info(name).name == name, name);
      FUZZ_REQUIRE(shards.count(index.shard_path(name)) == 1, index.shard_path(name));
      total += index.info(name).nbytes();
    }
    FUZZ_REQUIRE(total == index.total_bytes(), dir);
    // Mapping must agree with the header read up front.
    const auto file = index.mapped_file(index.names().front());
    FUZZ_REQUIRE(file->find(index.names().front()) != nullptr, index.names().front());
    dp::fuzz::note_accepted();
  } catch (const dp::Error&) {
    dp::fuzz::note_rejected();  // a clean rejection
  }
  return 0;
}
