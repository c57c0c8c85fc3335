// libFuzzer target over the LoRA adapter parser (dp::io::parse_lora_image) and its fit to a model
// (dp::models::fit_lora_to_model), which `generate --lora` and `inspect --lora` run on files users download.
//
// Contract: reject with dp::Error, or return modules that are safe to load: each names a Linear of the model,
// its down factor is (rank, in) and its up factor holds the rows the module takes, every alpha and multiplier is
// finite, and the scaling PEFT would compute is finite. Anything else aborts.
//
// The model is fixed and tiny (it must match tests/unit/io_lora_file_test.cpp, which checks that the corpus's
// bad_* files are refused and its valid_* files accepted): FLUX with inner dim 32 (2 heads of 16), 2 double and
// 2 single blocks, 16 input channels, 32-wide text and pooled inputs; CLIP with width 32, MLP 37, 2 layers.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "fuzz_verdict.h"
#include "io/lora_file.h"
#include "models/lora_check.h"

namespace {

[[noreturn]] void invariant_failed(const char* what, const std::string& detail) {
  std::fprintf(stderr, "lora_file_fuzz: accepted adapter breaks invariant: %s (%s)\n", what, detail.c_str());
  std::abort();
}

#define FUZZ_REQUIRE(cond, detail)                  \
  do {                                              \
    if (!(cond)) invariant_failed(#cond, (detail)); \
  } while (0)

dp::models::FluxConfig flux() {
  dp::models::FluxConfig c;
  c.num_layers = 2;
  c.num_single_layers = 2;
  c.num_attention_heads = 2;
  c.attention_head_dim = 16;
  c.axes_dims_rope = {4, 6, 6};
  c.in_channels = 16;
  c.joint_attention_dim = 32;
  c.pooled_projection_dim = 32;
  return c;
}

dp::models::ClipTextConfig clip() {
  dp::models::ClipTextConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 37;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view image(reinterpret_cast<const char*>(data), size);
  static const auto flux_config = flux();
  static const auto clip_config = clip();
  dp::io::LoraFile file;
  try {
    file = dp::io::parse_lora_image(image, "fuzz.safetensors");
    dp::models::fit_lora_to_model(file, flux_config, &clip_config);
  } catch (const dp::Error&) {
    dp::fuzz::note_rejected();
    return 0;
  }
  const auto header = dp::io::parse_safetensors_image(image, "fuzz.safetensors");
  FUZZ_REQUIRE(!file.modules.empty(), "no modules");
  for (const auto& m : file.modules) {
    const auto* down = header.find(m.down_key);
    const auto* up = header.find(m.up_key);
    FUZZ_REQUIRE(down != nullptr && up != nullptr, m.module);
    FUZZ_REQUIRE(down->shape.size() == 2 && up->shape.size() == 2, m.module);
    FUZZ_REQUIRE(down->shape[0] == m.rank && up->shape[1] == m.rank && m.rank >= 1, m.module);
    FUZZ_REQUIRE(down->shape[1] == m.in_features, m.module);
    FUZZ_REQUIRE(m.row_offset >= 0 && m.out_features >= 1 && m.row_offset + m.out_features <= up->shape[0], m.module);
    FUZZ_REQUIRE(m.parts >= 1 && m.part >= 0 && m.part < m.parts, m.module);
    FUZZ_REQUIRE(std::isfinite(m.down_multiplier) && std::isfinite(m.up_multiplier), m.module);
    FUZZ_REQUIRE(std::isfinite(dp::io::lora_scaling(m.alpha, m.rank, 1.0)), m.module);
    if (m.component == dp::io::LoraComponent::transformer)
      FUZZ_REQUIRE(m.block < flux_config.num_blocks(), m.module);
  }
  dp::fuzz::note_accepted();
  return 0;
}
