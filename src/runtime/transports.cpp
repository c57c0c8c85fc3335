#include "runtime/transports.h"

#include "core/error.h"
#include "runtime/distributed_generate.h"
#include "runtime/mpi_transport.h"
#ifdef DIFFPIPE_HAVE_NCCL
#include "runtime/nccl_transport.h"
#endif
#include "runtime/world.h"

namespace dp::runtime {

std::string choose_transport(const std::string& requested, bool cuda_device, int world_size) {
  DP_CHECK(requested == "auto" || requested == "nccl" || requested == "mpi", "--transport: expected auto, nccl or mpi, got '",
           requested, "'");
  if (requested == "mpi") return "mpi";
  if (requested == "auto") return cuda_device && built_with_nccl() && world_size > 1 ? "nccl" : "mpi";
  DP_CHECK(cuda_device, "--transport nccl moves tensors between GPUs and needs --device cuda; with --device cpu use "
           "--transport mpi (or auto)");
  DP_CHECK(built_with_nccl(), "--transport nccl: this diffpipe was built without NCCL (configure with nccl.h and "
           "libnccl found, or -DDIFFPIPE_NCCL_ROOT=DIR); use --transport mpi (or auto)");
  return "nccl";
}

bool built_with_nccl() {
#ifdef DIFFPIPE_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::string nccl_version_text(bool with_path) {
#ifdef DIFFPIPE_HAVE_NCCL
  const std::string text = nccl_loaded_version();
  return with_path ? text : text.substr(0, text.find(" ("));
#else
  (void)with_path;
  return "no NCCL in this build";
#endif
}

std::unique_ptr<Transport> make_transport(const std::string& name, const RingLayout& layout, const World& world,
                                          const at::Device& device, const RuntimeOptions& options) {
  if (name == "mpi") return std::make_unique<MpiTransport>(world.rank(), world.size(), options.transport_timeout_seconds);
#ifdef DIFFPIPE_HAVE_NCCL
  // The boundaries that carry tensors: coordinator -> first stage (unless rank 0 runs it), stage -> stage, last
  // stage -> coordinator. Ranks off the ring only hear a shutdown, which is control alone (MPI).
  std::vector<NcclLink> links;
  const auto& stages = layout.stages();
  if (!layout.coordinator_runs_first_stage()) links.push_back({0, stages.front().rank});
  for (size_t i = 1; i < stages.size(); ++i) links.push_back({stages[i - 1].rank, stages[i].rank});
  if (stages.back().rank != 0) links.push_back({stages.back().rank, 0});
  return std::make_unique<NcclTransport>(world.rank(), world.size(), options.transport_timeout_seconds, device, links);
#else
  (void)layout;
  (void)device;
  DP_FAIL("rank ", world.rank(), ": transport ", name, " is not in this build");
#endif
}

}  // namespace dp::runtime
