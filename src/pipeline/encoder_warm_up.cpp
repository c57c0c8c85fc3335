#include "pipeline/encoder_warm_up.h"

#include <atomic>

namespace dp::pipeline {
namespace {
std::atomic<bool> enabled{false};  // off unless a run turns it on: tests and tools load encoders plainly
}  // namespace

bool encoder_warm_up_enabled() { return enabled; }
void set_encoder_warm_up(bool on) { enabled = on; }

}  // namespace dp::pipeline
