#pragma once
// The ring's messages over MPI, staged through host memory: for CPU runs, CI, and ranks that share a GPU.
// Each message is a fixed-size header (validated on arrival: magic, version, kind, tensor count, dtypes and
// shapes within limits) followed by one MPI message per tensor (split into 1 GiB pieces). A sequence group's
// all-to-all is MPI_Ialltoallv on the group's own communicator, staged through one host buffer each way.
#include <mpi.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "runtime/transport.h"

namespace dp::runtime {

class MpiTransport : public Transport {
 public:
  // timeout_seconds: the longest wait for any one message or delivery. `group`: the world ranks of this rank's
  // sequence group in shard order (itself among them), or empty; with groups of several ranks the constructor is
  // collective over the world (every rank passes its own group, all of one size).
  MpiTransport(int rank, int world_size, double timeout_seconds, std::vector<int> group = {});
  ~MpiTransport() override;

  void send(int peer, Message message) override;
  Message receive(int peer) override;
  Message receive_any(const std::vector<int>& peers) override;
  bool has_message(int peer) override;
  void flush() override;
  void report_failure(const std::string& reason) override;
  uint64_t bytes_sent() const override { return bytes_sent_; }
  uint64_t bytes_received() const override { return bytes_received_; }
  void all_to_all(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv, int step) override;
  std::vector<ExchangeSpan> take_exchange_spans() override;
  uint64_t exchange_bytes_sent() const override { return exchange_bytes_sent_; }
  uint64_t exchange_bytes_received() const override { return exchange_bytes_received_; }

 private:
  struct PendingSend {
    int peer = 0;
    std::vector<int64_t> header;
    std::vector<at::Tensor> staged;  // host copies, alive until delivered
    std::vector<MPI_Request> requests;
  };
  // Polls `requests` to completion, moving queued sends along and watching for failures, at most the timeout.
  void wait(std::vector<MPI_Request>& requests, const std::string& what, int peer);
  void progress_sends();
  void wait_oldest_send();

  int rank_, world_size_;
  double timeout_seconds_;
  std::deque<std::unique_ptr<PendingSend>> pending_;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  std::vector<int> group_;
  int group_index_ = -1;
  MPI_Comm group_comm_ = MPI_COMM_NULL;
  std::vector<ExchangeSpan> exchange_spans_;
  uint64_t exchange_bytes_sent_ = 0, exchange_bytes_received_ = 0;
};

}  // namespace dp::runtime
