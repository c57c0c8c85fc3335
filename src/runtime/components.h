#pragma once
// Which rank runs CLIP, T5 and the VAE. Without --pipeline-device-map the coordinator runs all three on its
// device, as a one-process run does. With `--pipeline-device-map balanced` the three are placed as
// diffusers' pipeline-level "balanced" places them (placement::place_components_balanced, the map
// `plan --pipeline-device-map balanced --components text_encoder,text_encoder_2,vae` prints, with the same
// --max-memory): GPU d of that map is rank d, and "cpu" means the coordinator on the CPU.
#include <ATen/ATen.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "io/model_folder.h"

namespace dp::runtime {

struct ComponentPlace {
  std::string name;   // "text_encoder", "text_encoder_2", "vae"
  int rank = 0;
  bool on_cpu = false;  // "cpu" in the map: the coordinator runs it on its CPU
  int64_t bytes = 0;    // weights at the run dtype, as the placement counted them (0 without a map)
  // Where it computes on its rank, given that rank's device.
  at::Device device(const at::Device& rank_device) const { return on_cpu ? at::Device(at::kCPU) : rank_device; }
};

struct ComponentPlan {
  ComponentPlace clip{"text_encoder"}, t5{"text_encoder_2"}, vae{"vae"};
  bool from_map = false;  // --pipeline-device-map was given
  // The phases' hf_device_map as diffusers' pipe.hf_device_map shows them: {"text_encoder": 0, ...}.
  nlohmann::ordered_json encode_map() const;
  nlohmann::ordered_json decode_map() const;
};

// Places the components; throws before any weight is read when the map names a GPU index at or past the
// world size (naming the component, its GPU and the world), or a strategy other than "balanced".
// `max_memory` is --max-memory as `plan` reads it (empty: every rank's GPU at `plan`'s default budget).
// With --sequence-parallel K the map's GPUs are the world's stage groups: GPU d is group d, whose first rank
// (d x K) runs what the map puts there.
ComponentPlan plan_components(const io::ModelFolder& folder, const std::string& pipeline_device_map,
                              const std::string& max_memory, at::ScalarType dtype, int world_size,
                              int sequence_parallel = 1);

// Which text encoders this rank warms up while weights stream (FluxPipeline::start_encoder_warm_up), and why.
struct EncoderWarmUp {
  bool clip = false, t5 = false;
  std::string reason;  // for the log when a cap decided it
};

// The encoders `plan` puts on `rank`'s GPU are warmed up, unless --max-memory caps that GPU (`gpu`: GPU d of the
// caps is stage group d) too tightly: the warm-up holds one block of zero weights and a forward's activations
// (models' warm_up_bytes, the larger of the two, since they run one after the other) beside the weights of the
// encoders loading on that GPU, and all of it must fit the cap. `rows` and `seq` are the warm-up's shape.
EncoderWarmUp plan_encoder_warm_up(const ComponentPlan& plan, const io::ModelFolder& folder,
                                   const std::string& max_memory, at::ScalarType dtype, int rank, int gpu,
                                   int64_t rows, int64_t seq);

}  // namespace dp::runtime
