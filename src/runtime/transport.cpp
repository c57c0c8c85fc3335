#include "runtime/transport.h"

#include "core/error.h"

namespace dp::runtime {

void Transport::connect() {
  if (connected_) return;
  finish_connecting();
  connected_ = true;
}

void Transport::check_connected(int rank, const char* call) const {
  DP_CHECK(connected_, "rank ", rank, ": internal error: a transport's ", call, " before connect()");
}

}  // namespace dp::runtime
