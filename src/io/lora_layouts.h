#pragma once
// Internal to io: the two LoRA key conversions (diffusers/PEFT keys in lora_file.cpp, kohya/BFL keys in
// lora_kohya.cpp) and the pieces both need. Users include io/lora_file.h.
#include <string>
#include <vector>

#include "io/lora_file.h"

namespace dp::io::lora_detail {

// The tensors of a LoRA file after diffusers' first filter (DoRA scales dropped), in key order.
struct LoraKeys {
  const SafetensorsHeader* header = nullptr;
  const TensorBytes* read_bytes = nullptr;
  std::string source;
  std::vector<const TensorInfo*> tensors;
};

// The value of a one-element floating tensor (an alpha); throws naming the key when it is not one, or when
// it is not finite.
double scalar_value(const LoraKeys& keys, const TensorInfo& info);
// The value as `dtype` holds it (round to nearest even): PEFT's and diffusers' arithmetic on alpha tensors
// happens in the tensor's dtype.
double round_to(DType dtype, double value);

// A down/up pair's shapes: 2-D floating tensors, down (rank, in), up (out, rank); fills those fields of `m`.
void read_factor_shapes(const LoraKeys& keys, const TensorInfo& down, const TensorInfo& up, LoraModule& m);

// kohya's scale_down / scale_up: alpha / rank split into two powers of two so neither factor underflows.
// `dtype` is where diffusers does this arithmetic: a tensor's dtype, or F64 for a Python float.
void fold_alpha(double alpha, int64_t rank, DType dtype, double& down_multiplier, double& up_multiplier);

void parse_diffusers_layout(const LoraKeys& keys, LoraFile& out);
void parse_kohya_layout(const LoraKeys& keys, LoraFile& out);

}  // namespace dp::io::lora_detail
