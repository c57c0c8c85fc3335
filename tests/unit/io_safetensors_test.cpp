// The safetensors reader: valid files round-trip, and every broken file is rejected with a message that
// names the file, the tensor and the rule.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/torch_tensors.h"
#include "io/weight_index.h"
#include "test_support.h"

namespace dp::io {
namespace {

std::string image_with_header(const std::string& json, std::size_t data_bytes) {
  std::string image(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) image[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  image += json;
  image.append(data_bytes, '\x01');
  return image;
}

std::string error_of(const std::string& image) {
  try {
    parse_safetensors_image(image, "case.safetensors");
  } catch (const dp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, ParsesValidHeader) {
  const auto header = parse_safetensors_image(
      image_with_header(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                        R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"__metadata__":{"format":"pt"}})",
                        12),
      "ok.safetensors");
  ASSERT_EQ(header.tensors.size(), 2u);
  EXPECT_EQ(header.tensors[0].name, "a");
  EXPECT_EQ(header.tensors[0].dtype, DType::BF16);
  EXPECT_EQ(header.tensors[1].begin, 4u);
  EXPECT_EQ(header.metadata.at("format"), "pt");
  EXPECT_NE(header.find("b"), nullptr);
  EXPECT_EQ(header.find("c"), nullptr);
}

TEST(Safetensors, AcceptsZeroSizedAndScalarTensors) {
  const auto header = parse_safetensors_image(
      image_with_header(R"({"empty":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
                        R"("scalar":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})",
                        8),
      "ok.safetensors");
  EXPECT_EQ(header.tensors.size(), 2u);
}

struct BrokenCase {
  const char* label;
  std::string image;
  std::vector<std::string> expected;  // substrings of the message
};

std::vector<BrokenCase> broken_cases() {
  const std::string one = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string huge(8, '\0');
  const uint64_t big = 200'000'000;
  for (int i = 0; i < 8; ++i) huge[i] = static_cast<char>((big >> (8 * i)) & 0xff);
  return {
      {"short file", "abc", {"case.safetensors", "shorter than the 8-byte length prefix"}},
      {"huge header", huge, {"header length 200000000 exceeds the limit"}},
      {"header past end", image_with_header(one, 8).substr(0, 20), {"runs past the end"}},
      {"truncated data", image_with_header(one, 4), {"cover 8 bytes", "truncated"}},
      {"trailing bytes", image_with_header(one, 12), {"trailing bytes"}},
      {"bad json", image_with_header(R"({"w":{"dtype":"F32",)", 0), {"not valid JSON"}},
      {"not an object", image_with_header("[1,2]", 0), {"must be a JSON object"}},
      {"unknown dtype", image_with_header(R"({"w":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", 2),
       {"'w'", "unknown dtype 'F8_E9'"}},
      {"lying shape", image_with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       {"'w'", "12 bytes but data_offsets cover 8"}},
      {"overlap",
       image_with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         12),
       {"'b'", "overlaps"}},
      {"gap",
       image_with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                         12),
       {"gap of 4 bytes before tensor 'b'"}},
      {"reversed offsets", image_with_header(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4),
       {"'w'", "past end"}},
      {"negative dim", image_with_header(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
       {"'w'", "non-negative integer"}},
      {"overflowing shape",
       image_with_header(
           R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
       {"'w'", "overflows 64 bits"}},
      {"bytes overflow",
       image_with_header(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8),
       {"'w'", "byte size overflows"}},
      {"duplicate key",
       image_with_header(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                         R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                         2),
       {"'w' appears twice"}},
      {"duplicate field", image_with_header(R"({"w":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1),
       {"'dtype' appears twice"}},
      {"zero hides overflow",
       image_with_header(R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", 0),
       {"'w'", "overflow 64 bits"}},
      {"extra field", image_with_header(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1),
       {"unexpected field 'x'"}},
      {"missing offsets", image_with_header(R"({"w":{"dtype":"U8","shape":[1]}})", 1), {"'data_offsets'"}},
      {"float dim", image_with_header(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1),
       {"non-negative integer"}},
      {"bad metadata", image_with_header(R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'"}},
      {"deep nesting", image_with_header(std::string(64, '[') + std::string(64, ']'), 0), {"JSON"}},
  };
}

TEST(Safetensors, RejectsBrokenFilesWithContext) {
  for (const auto& c : broken_cases()) {
    const std::string message = error_of(c.image);
    ASSERT_FALSE(message.empty()) << c.label << " was accepted";
    for (const auto& part : c.expected) EXPECT_NE(message.find(part), std::string::npos) << c.label << ": " << message;
  }
}

TEST(Safetensors, BrokenFilesOnDiskAreRejectedByEveryEntryPoint) {
  const auto dir = dp::test::temp_dir("broken");
  for (const auto& c : broken_cases()) {
    const std::string path = dir + "/broken.safetensors";
    dp::test::write_file(path, c.image);
    EXPECT_THROW(read_safetensors_header(path), dp::Error) << c.label;
    EXPECT_THROW(SafetensorsFile::open(path), dp::Error) << c.label;
  }
  EXPECT_THROW(SafetensorsFile::open(dir + "/missing.safetensors"), dp::Error);
}

TEST(Safetensors, WriterRoundTripsThroughTorch) {
  const auto dir = dp::test::temp_dir("roundtrip");
  SafetensorsWriter writer;
  writer.add("x.weight", DType::F32, {2, 3});
  writer.add("y.bias", DType::BF16, {3});
  writer.set_metadata("format", "pt");
  const at::Tensor x = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor y = at::tensor({1.5f, -2.0f, 3.25f}).to(at::kBFloat16);
  writer.write(dir + "/model.safetensors", [&](std::size_t i, void* out, uint64_t n) {
    std::memcpy(out, (i == 0 ? x : y).data_ptr(), n);
  });
  const auto index = WeightIndex::open_dir(dir);
  EXPECT_EQ(index.size(), 2u);
  EXPECT_TRUE(at::equal(load_tensor(index, "x.weight", at::kFloat), x));
  EXPECT_TRUE(at::equal(load_tensor(index, "y.bias", at::kBFloat16), y));
  EXPECT_TRUE(at::allclose(load_tensor(index, "y.bias", at::kFloat), y.to(at::kFloat)));
  EXPECT_THROW(load_tensor(index, "z", at::kFloat), dp::Error);
}

// read() (pread, the CUDA loader's path) gives the bytes the mapping holds, refuses ranges outside the tensor,
// and names the file when it was cut after opening.
TEST(Safetensors, ReadGivesTheMappedBytesAndNamesATruncatedFile) {
  const auto dir = dp::test::temp_dir("pread");
  SafetensorsWriter writer;
  writer.add("a", DType::F32, {1000});
  writer.add("b", DType::F32, {3000});
  const at::Tensor values = at::arange(4000, at::kFloat);
  writer.write(dir + "/model.safetensors", [&](std::size_t i, void* out, uint64_t n) {
    std::memcpy(out, static_cast<const float*>(values.data_ptr()) + (i == 0 ? 0 : 1000), n);
  });
  const auto file = SafetensorsFile::open(dir + "/model.safetensors");
  const TensorInfo& b = file->at("b");
  std::vector<std::byte> got(4000);
  file->read(b, 400, 4000, got.data());
  EXPECT_EQ(std::memcmp(got.data(), file->data(b) + 400, 4000), 0);
  EXPECT_EQ(reinterpret_cast<const float*>(got.data())[0], 1100.0f);
  EXPECT_THROW(file->read(b, 11990, 20, got.data()), dp::Error);
  EXPECT_THROW(file->read(b, 12001, 0, got.data()), dp::Error);
  std::filesystem::resize_file(dir + "/model.safetensors", std::filesystem::file_size(dir + "/model.safetensors") - 100);
  try {
    file->read(b, 11000, 1000, got.data());
    FAIL() << "a read past the end of the cut file succeeded";
  } catch (const dp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, ShardedIndexIsValidated) {
  const auto dir = dp::test::temp_dir("sharded");
  auto write_shard = [&](const std::string& file, const std::string& tensor) {
    SafetensorsWriter writer;
    writer.add(tensor, DType::F32, {4});
    writer.write(dir + "/" + file, [](std::size_t, void* out, uint64_t n) { std::memset(out, 0, n); });
  };
  write_shard("a.safetensors", "first");
  write_shard("b.safetensors", "second");
  const std::string index_path = dir + "/diffusion_pytorch_model.safetensors.index.json";
  dp::test::write_file(index_path, R"({"weight_map":{"first":"a.safetensors","second":"b.safetensors"}})");
  const auto index = WeightIndex::open_dir(dir);
  EXPECT_EQ(index.size(), 2u);
  EXPECT_NE(index.shard_path("second").find("b.safetensors"), std::string::npos);

  auto error_for = [&](const std::string& json) -> std::string {
    dp::test::write_file(index_path, json);
    try {
      WeightIndex::open_dir(dir);
    } catch (const dp::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_for(R"({"weight_map":{"first":"a.safetensors","second":"a.safetensors"}})").find("'second'"),
            std::string::npos);
  EXPECT_NE(error_for(R"({"weight_map":{"first":"../a.safetensors"}})").find("not a plain file name"),
            std::string::npos);
  // Files the index does not reference are not read, as in diffusers.
  dp::test::write_file(index_path, R"({"weight_map":{"first":"a.safetensors"}})");
  EXPECT_EQ(WeightIndex::open_dir(dir).size(), 1u);
  EXPECT_NE(error_for(R"({"weight_map":{"first":"a.safetensors","second":"b.safetensors","third":"b.safetensors"}})")
                .find("'third'"),
            std::string::npos);
  EXPECT_NE(error_for(R"({"weight_map":{"first":"a.safetensors","second":"c.safetensors"}})").find("c.safetensors"),
            std::string::npos);
  EXPECT_NE(error_for("{").find("not valid JSON"), std::string::npos);
}

TEST(Safetensors, UnalignedTensorsAreCopied) {
  const auto dir = dp::test::temp_dir("unaligned");
  // One byte of U8 first pushes the F32 tensor off its natural alignment.
  SafetensorsWriter writer;
  writer.add("pad", DType::U8, {1});
  writer.add("w", DType::F32, {2});
  const float values[2] = {3.0f, -1.0f};
  writer.write(dir + "/m.safetensors", [&](std::size_t i, void* out, uint64_t n) {
    if (i == 0) *static_cast<uint8_t*>(out) = 7;
    else std::memcpy(out, values, n);
  });
  const auto index = WeightIndex::open_dir(dir);
  const at::Tensor w = load_tensor(index, "w", at::kFloat);
  EXPECT_FLOAT_EQ(w[0].item<float>(), 3.0f);
  EXPECT_FLOAT_EQ(w[1].item<float>(), -1.0f);
}

}  // namespace
}  // namespace dp::io
