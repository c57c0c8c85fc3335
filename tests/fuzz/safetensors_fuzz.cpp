// libFuzzer target over the safetensors file parser (dp::io::parse_safetensors_image).
//
// The parser's contract is "reject with dp::Error or return a header that is safe to use". So:
//   * dp::Error is the only exception swallowed; anything else escapes and aborts, which libFuzzer reports.
//   * An accepted header is checked against the invariants that SafetensorsFile::data() and the loaders rely
//     on (exact tiling of the data buffer, sizes matching shape x dtype, sorted unique names). A violation
//     aborts, because it would let a hostile file make us read outside the mapping.
//   * An accepted header is rebuilt as JSON and parsed again; it must be accepted with the same content, so
//     a file the parser accepted can always be rewritten by our own writer without changing meaning.
//
// Built two ways (see CMakeLists.txt and run_fuzz.sh): with clang + -fsanitize=fuzzer, and with the normal
// compiler as a corpus replayer (replay_main.cpp). DP_WITH_LIBFUZZER marks the first, which is the only one
// where LLVMFuzzerMutate exists, so the custom mutator is compiled only there.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "fuzz_verdict.h"
#include "io/safetensors.h"

namespace {

[[noreturn]] void invariant_failed(const char* what, const std::string& detail) {
  std::fprintf(stderr, "safetensors_fuzz: accepted header breaks invariant: %s (%s)\n", what, detail.c_str());
  std::abort();
}

#define FUZZ_REQUIRE(cond, detail)                       \
  do {                                                   \
    if (!(cond)) invariant_failed(#cond, (detail));      \
  } while (0)

void check_header(const dp::io::SafetensorsHeader& header, uint64_t image_size) {
  using dp::io::TensorInfo;
  FUZZ_REQUIRE(header.header_size <= dp::io::kMaxHeaderBytes, std::to_string(header.header_size));
  FUZZ_REQUIRE(header.data_offset() <= image_size, std::to_string(header.data_offset()));
  const uint64_t data_size = image_size - header.data_offset();

  for (std::size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorInfo& t = header.tensors[i];
    // Names are the lookup key (find() binary-searches), so they must be sorted and unique.
    if (i > 0) FUZZ_REQUIRE(header.tensors[i - 1].name < t.name, t.name);
    FUZZ_REQUIRE(t.name != "__metadata__", t.name);
    FUZZ_REQUIRE(header.find(t.name) == &t, t.name);
    FUZZ_REQUIRE(t.begin <= t.end, t.name);
    FUZZ_REQUIRE(t.end <= data_size, t.name);
    // numel() multiplies without overflow checks; the parser promises the product fits in 64 bits.
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      FUZZ_REQUIRE(d >= 0, t.name);
      FUZZ_REQUIRE(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel), t.name);
    }
    FUZZ_REQUIRE(numel == t.numel(), t.name);
    uint64_t nbytes = 0;
    FUZZ_REQUIRE(!__builtin_mul_overflow(numel, dp::io::dtype_size(t.dtype), &nbytes), t.name);
    FUZZ_REQUIRE(nbytes == t.nbytes(), t.name);
    FUZZ_REQUIRE(dp::io::dtype_size(t.dtype) != 0, t.name);
  }

  // Exact tiling: sorted by offset, every tensor starts where the previous ended and the last ends at the
  // end of the file. Zero-sized tensors may sit anywhere on a boundary.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : header.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  for (const TensorInfo* t : by_offset) {
    FUZZ_REQUIRE(t->begin == cursor, t->name);
    cursor = t->end;
  }
  FUZZ_REQUIRE(cursor == data_size, std::to_string(cursor) + " vs " + std::to_string(data_size));
}

// The header as our writer would emit it (same field layout as src/io/safetensors_writer.cpp).
std::string rebuild_json(const dp::io::SafetensorsHeader& header) {
  nlohmann::json doc = nlohmann::json::object();
  if (!header.metadata.empty()) doc["__metadata__"] = header.metadata;
  for (const auto& t : header.tensors) {
    doc[t.name] = {{"dtype", std::string(dp::io::dtype_name(t.dtype))},
                   {"shape", t.shape},
                   {"data_offsets", {t.begin, t.end}}};
  }
  // dump() throws type_error 316 on invalid UTF-8; the parser must never have let such a string through,
  // so that exception is deliberately not caught here.
  return doc.dump();
}

void check_round_trip(const dp::io::SafetensorsHeader& first, uint64_t data_size) {
  const std::string json = rebuild_json(first);
  dp::io::SafetensorsHeader second;
  try {
    second = dp::io::parse_safetensors_header(json, data_size, "roundtrip.safetensors");
  } catch (const dp::Error& e) {
    invariant_failed("rewritten header is accepted again", e.what());
  }
  FUZZ_REQUIRE(second.metadata == first.metadata, json);
  FUZZ_REQUIRE(second.tensors.size() == first.tensors.size(), json);
  for (std::size_t i = 0; i < first.tensors.size(); ++i) {
    const auto& a = first.tensors[i];
    const auto& b = second.tensors[i];
    FUZZ_REQUIRE(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin &&
                     a.end == b.end,
                 a.name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view image(reinterpret_cast<const char*>(data), size);
  dp::io::SafetensorsHeader header;
  try {
    header = dp::io::parse_safetensors_image(image, "fuzz.safetensors");
  } catch (const dp::Error&) {
    dp::fuzz::note_rejected();
    return 0;  // a clean rejection is the expected outcome for almost every input
  }
  check_header(header, size);
  check_round_trip(header, size - header.data_offset());
  dp::fuzz::note_accepted();
  return 0;
}

#ifdef DP_WITH_LIBFUZZER
// Structure-aware mutation. Byte-level mutations of the JSON almost always break the 8-byte length prefix,
// so most executions would stop at the prefix check. Half of the time we instead mutate only the header
// text and rewrite the prefix to match, and sometimes resize the data buffer to a number that appears in
// the header (a likely data_offsets end), so the tiling and success paths are reached. The other half stays
// plain byte mutation so the prefix and framing checks are still fuzzed.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

void write_le64(uint8_t* out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>((value >> (8 * i)) & 0xff);
}

uint64_t read_le64(const uint8_t* in) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | in[i];
  return value;
}

// Decimal numbers in the header below `limit`: candidates for the data buffer size.
std::vector<uint64_t> numbers_in(std::string_view text, uint64_t limit) {
  std::vector<uint64_t> found;
  for (std::size_t i = 0; i < text.size();) {
    if (text[i] < '0' || text[i] > '9') {
      ++i;
      continue;
    }
    uint64_t value = 0;
    bool small = true;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      if (small) value = value * 10 + static_cast<uint64_t>(text[i] - '0');
      if (value >= limit) small = false;
    }
    if (small) found.push_back(value);
  }
  return found;
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  if (seed % 2 == 0 || size < 8 || max_size < 16) return LLVMFuzzerMutate(data, size, max_size);

  const uint64_t claimed = read_le64(data);
  const std::size_t header_len = static_cast<std::size_t>(std::min<uint64_t>(claimed, size - 8));
  std::string header(reinterpret_cast<const char*>(data) + 8, header_len);
  std::string tail(reinterpret_cast<const char*>(data) + 8 + header_len, size - 8 - header_len);

  if ((seed >> 1) % 4 != 0) {
    // Mutate the header text in place, leaving room for the prefix and the current data buffer.
    const std::size_t room = max_size - 8 > tail.size() ? max_size - 8 - tail.size() : 0;
    if (room == 0 || header_len > room) return LLVMFuzzerMutate(data, size, max_size);
    header.resize(room);
    const std::size_t new_len =
        LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(header.data()), header_len, room);
    header.resize(new_len);
  } else {
    // Resize the data buffer to a size the header mentions.
    if (8 + header.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
    const auto candidates = numbers_in(header, max_size - 8 - header.size() + 1);
    if (!candidates.empty()) tail.assign(candidates[(seed >> 3) % candidates.size()], '\x01');
  }

  const std::size_t total = 8 + header.size() + tail.size();
  if (total > max_size) return LLVMFuzzerMutate(data, size, max_size);
  write_le64(data, header.size());
  std::memcpy(data + 8, header.data(), header.size());
  std::memcpy(data + 8 + header.size(), tail.data(), tail.size());
  return total;
}
#endif
