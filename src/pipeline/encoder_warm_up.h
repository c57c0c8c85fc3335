#pragma once
// Whether T5's kernels are warmed while its weights stream (FluxPipeline::start_t5) when no early warm-up
// (FluxPipeline::start_encoder_warm_up, which generate starts where runtime::plan_encoder_warm_up allows it) is
// running: set once per process by the runtime from --no-warm-up and the memory cap. Off under any cap, since
// this path does not check the cap's room for the block of zeros the warm-up holds.
namespace dp::pipeline {

bool encoder_warm_up_enabled();
void set_encoder_warm_up(bool enabled);

}  // namespace dp::pipeline
