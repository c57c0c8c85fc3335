#pragma once
// Whether the text encoders' kernels are warmed while their weights stream (FluxPipeline::encode_t5): set once
// per process by the runtime from --no-warm-up and the memory cap (the warm-up briefly holds one T5 block of
// zeros, which a tight cap has no room for).
namespace dp::pipeline {

bool encoder_warm_up_enabled();
void set_encoder_warm_up(bool enabled);

}  // namespace dp::pipeline
