// The sequence group's all-to-alls over the NCCL transport: grouped sends and receives on the compute stream,
// at most one in flight.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "runtime/nccl_transport_internal.h"

namespace dp::runtime {

using namespace nccl_detail;

void NcclTransport::all_to_all(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv, int step) {
  check_connected(rank_, "all_to_all");
  guarded([&] { all_to_all_unguarded(send, recv, step); });
}

void NcclTransport::finish_exchanges() {
  guarded([&] { finish_exchanges_unguarded(); });
}

void NcclTransport::all_to_all_unguarded(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv,
                                         int step) {
  c10::cuda::CUDAGuard guard(device_);
  Channel* group = group_channel();
  DP_CHECK(group != nullptr && send.size() == group->ranks.size() && recv.size() == send.size(), "rank ", rank_,
           ": an all-to-all of ", send.size(), " parts without a sequence group of that size");
  for (size_t j = 0; j < send.size(); ++j)
    DP_CHECK(send[j].is_cuda() && recv[j].is_cuda() && send[j].is_contiguous() && recv[j].is_contiguous(), "rank ",
             rank_, ": all-to-all parts must be contiguous tensors on ", device_.str());
  // One exchange in flight: the host stays at most one all-to-all ahead of the device.
  finish_exchanges_unguarded();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device_.index()).stream();
  auto exchange = std::make_unique<Exchange>();
  exchange->step = step;
  exchange->start = std::make_unique<Event>(true);
  exchange->done = std::make_unique<Event>(true);
  if (exchange->start->event == nullptr || exchange->done->event == nullptr)
    fail(str("rank ", rank_, ": cudaEventCreate failed"));
  check_cuda(cudaEventRecord(exchange->start->event, stream), "cudaEventRecord");
  check_nccl(ncclGroupStart(), group, "ncclGroupStart");
  for (size_t j = 0; j < send.size(); ++j) {
    if (static_cast<int>(j) == group->index) continue;
    const size_t out_bytes = static_cast<size_t>(send[j].numel()) * send[j].element_size();
    const size_t in_bytes = static_cast<size_t>(recv[j].numel()) * recv[j].element_size();
    ncclResult_t result = ncclSend(send[j].data_ptr(), out_bytes, ncclUint8, static_cast<int>(j), group->comm, stream);
    if (result == ncclSuccess || result == ncclInProgress)
      result = ncclRecv(recv[j].data_ptr(), in_bytes, ncclUint8, static_cast<int>(j), group->comm, stream);
    if (result != ncclSuccess && result != ncclInProgress) {
      ncclGroupEnd();
      check_nccl(result, group, "ncclSend/ncclRecv (all-to-all)");
    }
    exchange_bytes_sent_ += out_bytes;
    exchange_bytes_received_ += in_bytes;
  }
  const ncclResult_t grouped = ncclGroupEnd();
  if (grouped != ncclInProgress) check_nccl(grouped, group, "ncclGroupEnd (all-to-all)");
  settle(*group, "ncclGroupEnd (all-to-all)");
  // This rank's own part, on the same stream.
  recv[static_cast<size_t>(group->index)].copy_(send[static_cast<size_t>(group->index)]);
  check_cuda(cudaEventRecord(exchange->done->event, stream), "cudaEventRecord");
  exchange_ = std::move(exchange);
}

void NcclTransport::finish_exchanges_unguarded() {
  if (exchange_ == nullptr) return;
  c10::cuda::CUDAGuard guard(device_);
  Channel* group = group_channel();
  wait_until(
      [&] {
        const cudaError_t state = cudaEventQuery(exchange_->done->event);
        if (state == cudaErrorNotReady) return false;
        check_cuda(state, "cudaEventQuery (all-to-all)");
        return true;
      },
      str("all-to-all of ", describe(*group)), -1);
  float ms = 0;
  if (cudaEventElapsedTime(&ms, exchange_->start->event, exchange_->done->event) == cudaSuccess)
    exchange_spans_.push_back({exchange_->step, ms / 1e3});
  exchange_.reset();
}

std::vector<ExchangeSpan> NcclTransport::take_exchange_spans() {
  std::vector<ExchangeSpan> out;
  out.swap(exchange_spans_);
  return out;
}

}  // namespace dp::runtime
