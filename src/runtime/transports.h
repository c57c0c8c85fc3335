#pragma once
// Which transport a run uses and how it is built (choose_transport and built_with_nccl are declared in
// runtime/distributed_generate.h, the runtime's public face).
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "runtime/mesh_layout.h"
#include "runtime/transport.h"

namespace dp::runtime {

class World;
struct RuntimeOptions;

// "NCCL 2.30.7" (with the library's path when `with_path`), or that this build has none.
std::string nccl_version_text(bool with_path);

// The transport `name` ("mpi" or "nccl") for this rank; collective: every rank calls it with the same layout.
// Its set-up is finished by Transport::connect (RunContext::connect_transport says where the run calls it).
std::unique_ptr<Transport> make_transport(const std::string& name, const MeshLayout& layout, const World& world,
                                          const at::Device& device, const RuntimeOptions& options);

}  // namespace dp::runtime
