#include "io/lora_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "io/lora_layouts.h"

namespace dp::io {
namespace lora_detail {
namespace {

float half_to_float(uint16_t bits) {
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) return std::ldexp(static_cast<float>(mantissa), -24) * (sign ? -1.0f : 1.0f);
  uint32_t out = sign;
  if (exponent == 31) out |= 0x7f800000u | (mantissa << 13);
  else out |= ((exponent - 15 + 127) << 23) | (mantissa << 13);
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

float bfloat16_to_float(uint16_t bits) {
  const uint32_t out = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

// Rounds to a binary format with `digits` significant bits whose smallest normal number is 2^(min_exponent - 1)
// (frexp's convention), to nearest even; overflow gives infinity.
double round_binary(double value, int digits, int min_exponent, double max_finite) {
  if (value == 0 || !std::isfinite(value)) return value;
  int exponent = 0;
  std::frexp(value, &exponent);
  const double quantum = std::ldexp(1.0, std::max(exponent, min_exponent) - digits);
  const double rounded = std::nearbyint(value / quantum) * quantum;
  return std::fabs(rounded) > max_finite ? std::copysign(INFINITY, value) : rounded;
}

}  // namespace

double round_to(DType dtype, double value) {
  switch (dtype) {
    case DType::F64: return value;
    case DType::F32: return static_cast<double>(static_cast<float>(value));
    // LibTorch computes half-precision arithmetic in float and rounds the result once.
    case DType::BF16: return round_binary(static_cast<float>(value), 8, -125, 3.3895313892515355e38);
    case DType::F16: return round_binary(static_cast<float>(value), 11, -13, 65504.0);
    default: DP_FAIL("no floating arithmetic in dtype ", dtype_name(dtype));
  }
}

double scalar_value(const LoraKeys& keys, const TensorInfo& info) {
  DP_CHECK(info.numel() == 1, keys.source, ": '", info.name, "' must hold one number (an alpha), got shape [",
           [&] {
             std::string s;
             for (int64_t d : info.shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
             return s;
           }(),
           "]");
  const std::byte* bytes = (*keys.read_bytes)(info);
  double value = 0;
  switch (info.dtype) {
    case DType::F64: std::memcpy(&value, bytes, 8); break;
    case DType::F32: {
      float f;
      std::memcpy(&f, bytes, 4);
      value = f;
      break;
    }
    case DType::F16:
    case DType::BF16: {
      uint16_t bits;
      std::memcpy(&bits, bytes, 2);
      value = info.dtype == DType::F16 ? half_to_float(bits) : bfloat16_to_float(bits);
      break;
    }
    default:
      DP_FAIL(keys.source, ": '", info.name, "' is ", dtype_name(info.dtype),
              "; an alpha must be a floating-point number (diffusers refuses other types)");
  }
  DP_CHECK(std::isfinite(value), keys.source, ": '", info.name, "' is ", value, "; an alpha must be finite");
  return value;
}

void read_factor_shapes(const LoraKeys& keys, const TensorInfo& down, const TensorInfo& up, LoraModule& m) {
  for (const TensorInfo* t : {&down, &up}) {
    DP_CHECK(t->dtype == DType::F32 || t->dtype == DType::F16 || t->dtype == DType::BF16 || t->dtype == DType::F64,
             keys.source, ": '", t->name, "' is ", dtype_name(t->dtype), "; LoRA factors must be floating point");
    DP_CHECK(t->shape.size() == 2, keys.source, ": '", t->name, "' has ", t->shape.size(),
             " dimensions; LoRA factors of a Linear are 2-D (convolution LoRAs are not for FLUX)");
  }
  m.rank = down.shape[0];
  m.in_features = down.shape[1];
  m.up_rows = up.shape[0];
  m.dtype = down.dtype;
  DP_CHECK(m.rank >= 1 && m.in_features >= 1 && m.up_rows >= 1, keys.source, ": '", down.name, "' [", m.rank, ", ",
           m.in_features, "] and '", up.name, "' [", up.shape[0], ", ", up.shape[1], "]: empty LoRA factors");
  DP_CHECK(up.shape[1] == m.rank, keys.source, ": rank mismatch: '", down.name, "' has rank ", m.rank, " (shape [",
           m.rank, ", ", m.in_features, "]) but '", up.name, "' has ", up.shape[1], " columns (shape [", up.shape[0],
           ", ", up.shape[1], "])");
}

void fold_alpha(double alpha, int64_t rank, DType dtype, double& down_multiplier, double& up_multiplier) {
  const double r = static_cast<double>(rank);
  // `alpha / rank`, then doubling scale_down while halving scale_up, in the dtype diffusers computes them.
  double scale_down = dtype == DType::F64 ? alpha / r : round_to(dtype, static_cast<float>(alpha) / static_cast<float>(r));
  double scale_up = 1.0;
  for (int guard = 0; guard < 2100 && round_to(dtype, scale_down * 2) < scale_up; ++guard) {
    scale_down = round_to(dtype, scale_down * 2);
    scale_up /= 2;
  }
  down_multiplier = scale_down;
  up_multiplier = scale_up;
}

}  // namespace lora_detail

using namespace lora_detail;

const char* lora_layout_name(LoraLayout layout) {
  switch (layout) {
    case LoraLayout::diffusers: return "diffusers/PEFT";
    case LoraLayout::kohya: return "kohya";
    case LoraLayout::bfl: return "BFL";
  }
  return "?";
}

const char* lora_component_name(LoraComponent component) {
  return component == LoraComponent::transformer ? "transformer" : "text_encoder";
}

bool LoraFile::has_component(LoraComponent component) const {
  return std::any_of(modules.begin(), modules.end(), [&](const LoraModule& m) { return m.component == component; });
}

int64_t LoraFile::min_rank() const {
  int64_t r = 0;
  for (const auto& m : modules) r = r == 0 ? m.rank : std::min(r, m.rank);
  return r;
}

int64_t LoraFile::max_rank() const {
  int64_t r = 0;
  for (const auto& m : modules) r = std::max(r, m.rank);
  return r;
}

double lora_scaling(const LoraAlpha& alpha, int64_t rank, double user_scale) {
  const double r = static_cast<double>(rank);
  if (alpha.equals_rank) return user_scale * r / r;  // Python ints: lora_alpha = r
  if (alpha.rslora) return user_scale * alpha.value / std::sqrt(r);
  if (!alpha.tensor_dtype || *alpha.tensor_dtype == DType::F64) return user_scale * alpha.value / r;
  // A tensor alpha: `scale * alpha` and `/ r` each rounded to its dtype (computed in float for half types).
  const DType dtype = *alpha.tensor_dtype;
  const double product = round_to(dtype, static_cast<float>(user_scale) * static_cast<float>(alpha.value));
  return round_to(dtype, static_cast<float>(product) / static_cast<float>(r));
}

LoraFile parse_lora(const SafetensorsHeader& header, const TensorBytes& read_bytes, const std::string& source) {
  LoraKeys keys;
  keys.header = &header;
  keys.read_bytes = &read_bytes;
  keys.source = source;
  size_t dora = 0;
  for (const auto& t : header.tensors) {
    // diffusers drops DoRA magnitudes with a warning and loads the rest as a plain LoRA.
    if (t.name.find("dora_scale") != std::string::npos) {
      ++dora;
      continue;
    }
    keys.tensors.push_back(&t);
  }
  LoraFile out;
  out.path = source;
  if (dora > 0)
    out.ignored.push_back(str(dora, " dora_scale key(s): diffusers loads DoRA files as plain LoRAs without them"));
  DP_CHECK(!keys.tensors.empty(), source, ": holds no tensors; not a LoRA adapter");
  const bool kohya = std::any_of(keys.tensors.begin(), keys.tensors.end(), [](const TensorInfo* t) {
    return t->name.find(".lora_down.weight") != std::string::npos;
  });
  if (kohya) {
    parse_kohya_layout(keys, out);
  } else {
    parse_diffusers_layout(keys, out);
  }
  DP_CHECK(!out.modules.empty(), source, ": no LoRA module of FluxPipeline's transformer or text_encoder in this ",
           lora_layout_name(out.layout), " file",
           out.ignored.empty() ? std::string() : str(" (ignored, as diffusers ignores them: ", out.ignored.front(), ")"));
  std::set<std::pair<LoraComponent, std::string>> seen;
  for (const auto& m : out.modules)
    DP_CHECK(seen.insert({m.component, m.module}).second, source, ": two keys change ", lora_component_name(m.component),
             " module '", m.module, "' (the second: '", m.down_key, "'); a file holds one LoRA per module");
  return out;
}

LoraFile parse_lora_image(std::string_view image, const std::string& source) {
  const SafetensorsHeader header = parse_safetensors_image(image, source);
  const auto* data = reinterpret_cast<const std::byte*>(image.data()) + header.data_offset();
  const TensorBytes read_bytes = [data](const TensorInfo& info) { return data + info.begin; };
  return parse_lora(header, read_bytes, source);
}

LoraFile read_lora_file(const std::string& path) {
  DP_CHECK(std::filesystem::is_regular_file(path), path, ": LoRA file not found (or not a regular file)");
  const auto file = SafetensorsFile::open(path);
  const TensorBytes read_bytes = [&file](const TensorInfo& info) { return file->data(info); };
  return parse_lora(file->header(), read_bytes, path);
}

namespace {

bool finite_values(const std::byte* bytes, DType dtype, uint64_t count, uint64_t* bad_index) {
  for (uint64_t i = 0; i < count; ++i) {
    bool finite = true;
    switch (dtype) {
      case DType::F64: {
        double v;
        std::memcpy(&v, bytes + 8 * i, 8);
        finite = std::isfinite(v);
        break;
      }
      case DType::F32: {
        uint32_t v;
        std::memcpy(&v, bytes + 4 * i, 4);
        finite = (v & 0x7f800000u) != 0x7f800000u;
        break;
      }
      case DType::BF16: {
        uint16_t v;
        std::memcpy(&v, bytes + 2 * i, 2);
        finite = (v & 0x7f80u) != 0x7f80u;
        break;
      }
      case DType::F16: {
        uint16_t v;
        std::memcpy(&v, bytes + 2 * i, 2);
        finite = (v & 0x7c00u) != 0x7c00u;
        break;
      }
      default: break;
    }
    if (!finite) {
      *bad_index = i;
      return false;
    }
  }
  return true;
}

}  // namespace

void check_lora_finite(const SafetensorsFile& file, const std::vector<const LoraModule*>& modules) {
  std::set<std::string> checked;
  const auto check = [&](const std::string& key) {
    if (!checked.insert(key).second) return;
    const TensorInfo& info = file.at(key);
    uint64_t bad = 0;
    DP_CHECK(finite_values(file.data(info), info.dtype, info.numel(), &bad), file.path(), ": '", key,
             "' holds a non-finite value (NaN or infinity) at element ", bad, "; the adapter is damaged");
  };
  for (const LoraModule* m : modules) {
    check(m->down_key);
    check(m->up_key);
  }
}

LoraSpec parse_lora_spec(const std::string& word) {
  LoraSpec spec;
  std::string rest = word;
  // NAME= in front when it is a plain name (no '/', '.' or ':' in it), so that a path holding '=' still works
  // as ./path.
  const size_t equals = rest.find('=');
  if (equals != std::string::npos && equals > 0 &&
      rest.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") >= equals) {
    spec.name = rest.substr(0, equals);
    rest = rest.substr(equals + 1);
  }
  // :SCALE at the end when what follows the last ':' is a number.
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos && colon + 1 < rest.size()) {
    const std::string number = rest.substr(colon + 1);
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (end != nullptr && *end == '\0' && end != number.c_str()) {
      DP_CHECK(std::isfinite(value), "--lora ", word, ": the scale must be a finite number, got ", number);
      spec.scale = value;
      rest = rest.substr(0, colon);
    }
  }
  DP_CHECK(!rest.empty(), "--lora ", word, ": no file (expected [NAME=]FILE[:SCALE])");
  spec.path = rest;
  if (spec.name.empty()) {
    std::string stem = std::filesystem::path(rest).filename().string();
    if (stem.size() > 12 && stem.substr(stem.size() - 12) == ".safetensors") stem.resize(stem.size() - 12);
    for (char& c : stem)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '_';
    spec.name = stem;
  }
  return spec;
}

void check_lora_specs(const std::vector<LoraSpec>& specs) {
  DP_CHECK(specs.size() <= kMaxLoraAdapters, specs.size(), " LoRA adapters given; at most ", kMaxLoraAdapters,
           " can be used in one run");
  std::set<std::string> names;
  for (const auto& s : specs) {
    DP_CHECK(!s.name.empty() && s.name.size() <= 64 &&
                 s.name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") ==
                     std::string::npos,
             "LoRA adapter name '", s.name, "' (", s.path, "): use 1 to 64 letters, digits, '_' or '-'");
    DP_CHECK(s.name != "none", "LoRA adapter name 'none' is reserved (<lora:none> in a prompt turns adapters off)");
    DP_CHECK(names.insert(s.name).second, "two LoRA adapters are named '", s.name,
             "'; give each its own name (--lora NAME=FILE[:SCALE], or \"name\" in the run config)");
    DP_CHECK(std::isfinite(s.scale), "LoRA adapter '", s.name, "': the scale must be finite, got ", s.scale);
    DP_CHECK(!s.path.empty(), "LoRA adapter '", s.name, "': no file");
  }
}

namespace {

// FNV-1a, 64 bit: a stable digest, not a security measure.
struct Fnv {
  uint64_t hash = 0xcbf29ce484222325ULL;
  void add(const std::string& text) {
    for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ULL;
    hash = (hash ^ 0xff) * 0x100000001b3ULL;
  }
  std::string hex() const {
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(hash));
    return out;
  }
};

std::string exact(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%a", value);
  return text;
}

}  // namespace

std::string lora_fingerprint(const LoraFile& file, const LoraSpec& spec) {
  Fnv fnv;
  fnv.add(spec.name);
  fnv.add(exact(spec.scale));
  fnv.add(lora_layout_name(file.layout));
  for (const auto& m : file.modules) {
    fnv.add(str(lora_component_name(m.component), " ", m.module, " ", m.down_key, " ", m.up_key, " ", m.rank, " ",
                m.in_features, " ", m.up_rows, " ", m.part, "/", m.parts, " ", exact(m.down_multiplier), " ",
                exact(m.up_multiplier), " ", exact(m.alpha.value), " ", m.alpha.equals_rank, m.alpha.rslora,
                m.alpha.tensor_dtype ? std::string(dtype_name(*m.alpha.tensor_dtype)) : "-"));
  }
  return fnv.hex();
}

bool lora_pattern_matches(std::string_view pattern, std::string_view module) {
  const bool anchored = !pattern.empty() && pattern.front() == '^';
  if (anchored) pattern.remove_prefix(1);
  const auto matches_at = [&](size_t start) {
    if (module.size() - start != pattern.size()) return false;
    for (size_t i = 0; i < pattern.size(); ++i)
      if (pattern[i] != '.' && pattern[i] != module[start + i]) return false;
    return true;
  };
  if (pattern.size() > module.size()) return false;
  if (matches_at(0)) return true;
  if (anchored) return false;
  // (.*\.)? consumed a prefix ending in a literal dot.
  const size_t start = module.size() - pattern.size();
  return start > 0 && module[start - 1] == '.' && matches_at(start);
}

}  // namespace dp::io
