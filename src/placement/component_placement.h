#pragma once
// Pipeline-level "balanced" (DiffusionPipeline.from_pretrained(device_map="balanced")): whole components
// placed on GPUs, largest first, GPUs visited largest budget first in a snake order (0..n-1, n-1..0), a
// component that does not fit its turn's GPU going to "cpu" without advancing. Unlike diffusers, every such
// component stays in the map on "cpu" (diffusers keeps only the last one).
#include <string>
#include <utility>
#include <vector>

#include "io/model_folder.h"
#include "io/safetensors.h"
#include "placement/device.h"

namespace dp::placement {

struct ComponentSize {
  std::string name;
  int64_t bytes = 0;
};

// A component's size at `run_dtype` as diffusers' pipeline-level "balanced" counts it, from its safetensors
// headers: plus the non-persistent buffers its class registers (accelerate counts them; checkpoints do not
// hold them), plus T5's encoder embedding when the checkpoint ties it to shared.weight (diffusers sizes the
// model built empty, where the two are separate tables).
int64_t component_bytes(const io::Component& component, const nlohmann::json& config, io::DType run_dtype);

struct ComponentPlacement {
  std::vector<std::pair<std::string, Device>> device_map;  // in placement order (largest first)
  std::vector<ComponentSize> sizes;                        // largest first
};

ComponentPlacement place_components_balanced(std::vector<ComponentSize> components, const MaxMemory& max_memory);

}  // namespace dp::placement
