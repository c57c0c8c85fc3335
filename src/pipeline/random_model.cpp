#include "pipeline/random_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors_writer.h"

namespace fs = std::filesystem;

namespace dp::pipeline {
namespace {

// splitmix64: a counter-based generator, so that tensor contents do not depend on the thread layout.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint16_t to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t to_f16(float value) {
  // Values here are small and finite, so a plain conversion through the hardware-independent path suffices.
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = bits & 0x7fffff;
  if (exponent <= 0) return static_cast<uint16_t>(sign);  // flush tiny values to zero
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7bff);
  mantissa += 0x1000;  // round
  if (mantissa & 0x800000) return static_cast<uint16_t>(sign | ((exponent + 1) << 10));
  return static_cast<uint16_t>(sign | (exponent << 10) | (mantissa >> 13));
}

void fill_tensor(const models::ParameterShape& p, io::DType dtype, uint64_t seed, void* out, unsigned threads) {
  uint64_t numel = 1;
  for (int64_t d : p.shape) numel *= static_cast<uint64_t>(d);
  const bool is_norm_weight = p.shape.size() == 1 && p.name.find("norm") != std::string::npos &&
                              p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
  const bool is_bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
  const double fan_in = p.shape.size() >= 2 ? static_cast<double>(numel / static_cast<uint64_t>(p.shape[0])) : 1.0;
  const float bound = is_bias ? 0.02f : static_cast<float>(1.0 / std::sqrt(fan_in));
  const uint64_t tensor_seed = mix(seed ^ std::hash<std::string>{}(p.name));
  auto value_at = [&](uint64_t i) -> float {
    if (is_norm_weight) return 1.0f;
    const double unit = static_cast<double>(mix(tensor_seed + i) >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>((2.0 * unit - 1.0) * bound);
  };
  auto fill_range = [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) {
      const float v = value_at(i);
      switch (dtype) {
        case io::DType::F32: static_cast<float*>(out)[i] = v; break;
        case io::DType::BF16: static_cast<uint16_t*>(out)[i] = to_bf16(v); break;
        case io::DType::F16: static_cast<uint16_t*>(out)[i] = to_f16(v); break;
        default: DP_FAIL("random weights support F32, BF16 and F16, not ", io::dtype_name(dtype));
      }
    }
  };
  const unsigned workers = numel < (1u << 20) ? 1u : std::max(1u, threads);
  std::vector<std::thread> pool;
  const uint64_t chunk = (numel + workers - 1) / workers;
  for (unsigned w = 0; w < workers; ++w) {
    const uint64_t begin = std::min<uint64_t>(numel, w * chunk), end = std::min<uint64_t>(numel, begin + chunk);
    if (workers == 1) fill_range(begin, end);
    else pool.emplace_back(fill_range, begin, end);
  }
  for (auto& t : pool) t.join();
}

}  // namespace

uint64_t write_random_component(const std::string& root, const RandomComponent& component,
                                const RandomWriteOptions& options) {
  const fs::path dir = fs::path(root) / component.name;
  fs::create_directories(dir);
  {
    std::ofstream config(dir / component.config_file);
    config << component.config.dump(2) << "\n";
    DP_CHECK(config.good(), (dir / component.config_file).string(), ": write failed");
  }
  const unsigned threads = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  // Group parameters into shards of at most max_shard_bytes, in order.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (size_t i = 0; i < component.parameters.size(); ++i) {
    uint64_t bytes = io::dtype_size(options.dtype);
    for (int64_t d : component.parameters[i].shape) bytes *= static_cast<uint64_t>(d);
    if (shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += bytes;
    total += bytes;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char numbered[64];
    std::snprintf(numbered, sizeof(numbered), "-%05zu-of-%05zu", s + 1, shards.size());
    const std::string file = component.weights_stem + (shards.size() == 1 ? "" : numbered) + ".safetensors";
    io::SafetensorsWriter writer;
    writer.set_metadata("format", "pt");
    for (size_t i : shards[s]) {
      writer.add(component.parameters[i].name, options.dtype, component.parameters[i].shape);
      weight_map[component.parameters[i].name] = file;
    }
    writer.write(
        (dir / file).string(),
        [&](size_t local, void* out, uint64_t) {
          fill_tensor(component.parameters[shards[s][local]], options.dtype, options.seed, out, threads);
        },
        options.sparse);
    DP_INFO("wrote ", (dir / file).string(), " (", writer.data_bytes(), " bytes)");
  }
  if (shards.size() > 1) {
    std::ofstream index(dir / (component.weights_stem + ".safetensors.index.json"));
    index << nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) << "\n";
  }
  return total;
}

RandomComponent flux_transformer_component(const models::FluxConfig& config) {
  return {"transformer", "config.json", config.to_json(), models::flux_parameter_shapes(config),
          "diffusion_pytorch_model"};
}

models::FluxConfig tiny_flux_config() {
  models::FluxConfig c;
  c.in_channels = 64;  // 16 latent channels packed 2x2, as FLUX.1-dev
  c.num_layers = 2;
  c.num_single_layers = 4;
  c.attention_head_dim = 16;
  c.num_attention_heads = 2;
  c.joint_attention_dim = 32;
  c.pooled_projection_dim = 32;
  c.guidance_embeds = true;
  c.axes_dims_rope = {4, 6, 6};
  return c;
}

}  // namespace dp::pipeline
