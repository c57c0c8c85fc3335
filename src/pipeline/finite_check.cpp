#include "pipeline/finite_check.h"

#include "core/error.h"

namespace dp::pipeline {

std::string RunSite::describe() const {
  std::string text = str("denoising step ", step, "/", steps);
  if (!placement.empty()) text += ", " + placement;
  return text;
}

bool all_finite(const at::Tensor& values) { return at::isfinite(values).all().item<bool>(); }

void check_step_latents(const at::Tensor& latents, const RunSite& site) {
  if (all_finite(latents)) return;
  // The latents entered the step finite (the previous check) and the guidance is finite (validated), so
  // the transformer's noise prediction is where the NaN or Inf came from.
  DP_FAIL(site.describe(), ": the latents hold NaN or Inf after this step: the transformer's output was not "
          "finite. Its weights hold NaN or Inf, or its activations overflow the run dtype (try --dtype fp32)");
}

}  // namespace dp::pipeline
