#pragma once
// FP8 GEMMs for the FLUX blocks' large projections (--fp8-gemms, off by default). A weight is quantised once,
// at load, to e4m3 with one fp32 scale per output channel; each call quantises its input rows the same way,
// one scale per token, and multiplies on the tensor cores with both scales and the bias applied in fp32
// (at::_scaled_mm, Hopper or Ada). Off the GPU the same arithmetic runs as an ATen composition (dequantised
// operands in fp32), which is the reference the CUDA tests hold the kernels to. Measured on an H100 against bf16
// (bench/RESULTS.md): a 1024x1024 step 102 ms against 126, the image 47 dB from bf16's with random weights.
#include <ATen/ATen.h>

#include "models/flux/flux_blocks.h"
#include "models/module_weights.h"

namespace dp::models::flux {

// Off unless DIFFPIPE_FP8_GEMMS=1 is in the environment or the setter turns it on (the CLI's --fp8-gemms).
bool fp8_gemms_enabled();
void set_fp8_gemms_enabled(bool enabled);

// Whether FP8 GEMMs can run for `dtype` on `device`: a CUDA device of compute capability 8.9 or newer with
// bf16 activations, or any CPU (emulated, for tests). Throws, naming the device, when not.
void check_fp8_gemms_supported(at::ScalarType dtype, at::Device device);

struct Fp8Rows {
  at::Tensor values;  // (rows, columns) float8_e4m3fn
  at::Tensor scales;  // (rows, 1) fp32: value * scale is the row's element
};
// Each row of x (rows, columns) scaled so its largest magnitude is e4m3's largest finite value (448).
Fp8Rows quantize_rows_fp8(const at::Tensor& x);
// The rows of [first | second] (second may be undefined) quantised as one matrix, each part through the tanh
// GELU first where asked and rounded to its dtype after it, as a GELU tensor is: a projection that reads a
// concatenation or an activation quantises it without the joined or activated tensor being written out.
Fp8Rows quantize_rows_fp8(const at::Tensor& first, bool gelu_first, const at::Tensor& second, bool gelu_second);

// rows (M, in) times an FP8 layer, plus its bias: (M, out) in `dtype`. Unfused LoRA adapters need the input
// itself: call the layer instead.
at::Tensor fp8_product(const Fp8Rows& rows, const Linear& layer, at::ScalarType dtype);
// Whether `layer` holds an FP8 weight and nothing that needs its unquantised input.
bool takes_fp8_rows(const Linear& layer);

// The layer with its weight in FP8 and its per-channel scale; a layer whose sizes are not multiples of 16 (the
// tensor cores' FP8 granularity) comes back unchanged.
Linear to_fp8(const Linear& layer);
// The blocks' projections (q|k|v, outputs, MLPs) in FP8; their modulation rows (one token each) stay as they are.
DoubleBlock to_fp8(const DoubleBlock& block);
SingleBlock to_fp8(const SingleBlock& block);

}  // namespace dp::models::flux
