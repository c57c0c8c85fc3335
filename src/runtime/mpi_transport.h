#pragma once
// The ring's messages over MPI, staged through host memory: for CPU runs, CI, and ranks that share a GPU.
// Each message is a fixed-size header (validated on arrival: magic, version, kind, tensor count, dtypes and
// shapes within limits) followed by one MPI message per tensor (split into 1 GiB pieces).
#include <mpi.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "runtime/transport.h"

namespace dp::runtime {

class MpiTransport : public Transport {
 public:
  // timeout_seconds: the longest wait for any one message or delivery.
  MpiTransport(int rank, int world_size, double timeout_seconds);
  ~MpiTransport() override;

  void send(int peer, Message message) override;
  Message receive(int peer) override;
  Message receive_any(const std::vector<int>& peers) override;
  bool has_message(int peer) override;
  void flush() override;
  void report_failure(const std::string& reason) override;
  uint64_t bytes_sent() const override { return bytes_sent_; }
  uint64_t bytes_received() const override { return bytes_received_; }

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
};

}  // namespace dp::runtime
