#pragma once
// Precompiled header for every LibTorch translation unit. ATen alone: torch/torch.h (autograd, nn, optim)
// doubles the parse cost and the models need none of it.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <map>
#include <memory>
#include <string>
#include <vector>
