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

std::unique_ptr<Transport> make_transport(const std::string& name, const MeshLayout& layout, const World& world,
                                          const at::Device& device, const RuntimeOptions& options) {
  // A sequence group of several ranks gets its all-to-all: its own communicator, created by every rank.
  const std::vector<int> group = layout.sequence_parallel() > 1 ? layout.group_ranks(world.rank()) : std::vector<int>{};
  if (name == "mpi")
    return std::make_unique<MpiTransport>(world.rank(), world.size(), options.transport_timeout_seconds, group);
#ifdef DIFFPIPE_HAVE_NCCL
  // The boundaries that carry tensors: coordinator -> first stage (unless rank 0 runs it), stage -> stage, last
  // stage -> coordinator, for every token shard. Ranks off the ring only hear a shutdown, which is control alone
  // (MPI).
  std::vector<NcclLink> links;
  for (const auto& link : layout.links()) links.push_back({link.from, link.to});
  NcclGroup nccl_group;
  nccl_group.index = layout.group_of(world.rank());
  nccl_group.count = layout.shape().stages;
  nccl_group.ranks = group;
  return std::make_unique<NcclTransport>(world.rank(), world.size(), options.transport_timeout_seconds, device, links,
                                         nccl_group);
#else
  (void)layout;
  (void)device;
  DP_FAIL("rank ", world.rank(), ": transport ", name, " is not in this build");
#endif
}

}  // namespace dp::runtime
