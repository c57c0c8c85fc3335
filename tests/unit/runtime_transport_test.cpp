// The runtime's transport pieces that run without MPI or a GPU. The ring's wire header, shared by the MPI and
// NCCL transports: what one rank encodes another decodes to the same message, and a header that could not have
// come from this build is refused, naming both ranks, before anything is allocated from it. The choice of
// transport. connect() runs a transport's set-up once, and a message before it is refused. The compute clock's
// bookkeeping per step.
#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"
#include "runtime/distributed_generate.h"
#include "runtime/ring.h"
#include "runtime/transport.h"
#include "runtime/wire_header.h"

namespace dp::runtime {
namespace {

using wire::kHeaderWords;
using wire::kTensorWords;

// The error `decode` raises for `words`, or "" when it accepts them.
std::string decode_error(const std::vector<int64_t>& words) {
  try {
    wire::decode(words, 2, 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<int64_t> valid_words() {
  Message message{MessageKind::activations, 5, 3, {at::zeros({2, 7, 8}), at::Tensor(), at::zeros({2}, at::kLong)}};
  return wire::encode(message, 1);
}

TEST(RuntimeWireHeader, DecodesWhatWasEncoded) {
  Message message{MessageKind::step, 11, 27,
                  {at::zeros({1, 4096, 64}, at::kBFloat16), at::zeros({1}), at::Tensor(), at::zeros({}, at::kHalf)}};
  const auto words = wire::encode(message, 0);
  ASSERT_EQ(words.size(), static_cast<size_t>(kHeaderWords));
  const wire::Header header = wire::decode(words, 1, 0);
  EXPECT_EQ(header.kind, MessageKind::step);
  EXPECT_EQ(header.microbatch, 11);
  EXPECT_EQ(header.step, 27);
  ASSERT_EQ(header.tensors.size(), 4u);
  EXPECT_TRUE(header.tensors[0].defined);
  EXPECT_EQ(header.tensors[0].dtype, at::kBFloat16);
  EXPECT_EQ(header.tensors[0].shape, (std::vector<int64_t>{1, 4096, 64}));
  EXPECT_EQ(header.tensors[0].bytes(), 4096 * 64 * 2);
  EXPECT_EQ(header.tensors[1].dtype, at::kFloat);
  EXPECT_EQ(header.tensors[1].bytes(), 4);
  EXPECT_FALSE(header.tensors[2].defined);
  EXPECT_EQ(header.tensors[3].dtype, at::kHalf);
  EXPECT_TRUE(header.tensors[3].shape.empty());  // a 0-dim tensor stays 0-dim
  EXPECT_EQ(header.tensors[3].bytes(), 2);
}

TEST(RuntimeWireHeader, MessagesWithoutTensorsAndNegativeIdsSurvive) {
  const auto header = wire::decode(wire::encode({MessageKind::shutdown, -1, -1, {}}, 3), 0, 3);
  EXPECT_EQ(header.kind, MessageKind::shutdown);
  EXPECT_EQ(header.microbatch, -1);
  EXPECT_EQ(header.step, -1);
  EXPECT_TRUE(header.tensors.empty());
}

TEST(RuntimeWireHeader, EncodeRefusesWhatTheWireCannotCarry) {
  const auto encode_error = [](const Message& message) {
    try {
      wire::encode(message, 4);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  {
    const std::string five = encode_error({MessageKind::activations, 0, 0, std::vector<at::Tensor>(5, at::zeros({1}))});
    EXPECT_NE(five.find("rank 4: a message carries at most 4 tensors"), std::string::npos) << five;
  }
  const std::string dims = encode_error({MessageKind::activations, 0, 0, {at::zeros({1, 1, 1, 1, 1})}});
  EXPECT_NE(dims.find("at most 4 dimensions"), std::string::npos) << dims;
  const std::string dtype = encode_error({MessageKind::activations, 0, 0, {at::zeros({1}, at::kDouble)}});
  EXPECT_NE(dtype.find("rank 4: the transport does not carry tensors of dtype Double"), std::string::npos) << dtype;
}

TEST(RuntimeWireHeader, RefusesCorruptHeadersNamingBothRanks) {
  ASSERT_EQ(decode_error(valid_words()), "");
  struct Case {
    const char* what;
    size_t word;
    int64_t value;
    const char* expected;
  };
  const size_t t0 = 5, t1 = 5 + kTensorWords;  // first words of tensor descriptors 0 and 1
  const std::vector<Case> cases = {
      {"magic", 0, 42, "bad magic"},
      {"version", 1, (int64_t{2} << 32) | 3, "wire version 2, this build speaks 1"},
      {"kind 0", 1, (int64_t{1} << 32) | 0, "unknown kind 0"},
      {"kind 10", 1, (int64_t{1} << 32) | 10, "unknown kind 10"},
      {"step", 3, int64_t{std::numeric_limits<int32_t>::max()} + 1, "step 2147483648"},
      {"negative count", 4, -1, "-1 tensors"},
      {"too many", 4, 5, "5 tensors"},
      {"defined flag", t0, 2, "tensor 0 descriptor"},
      {"dtype", t0 + 1, 9, "tensor 0: unknown dtype code 9"},
      {"ndim", t0 + 2, 5, "tensor 0 descriptor"},
      {"negative ndim", t0 + 2, -1, "tensor 0 descriptor"},
      {"negative size", t0 + 3, -2, "tensor 0 shape"},
      {"too big", t0 + 3, int64_t{1} << 40, "tensor 0 shape"},
  };
  for (const auto& c : cases) {
    auto words = valid_words();
    words[c.word] = c.value;
    const std::string error = decode_error(words);
    EXPECT_NE(error.find("rank 2: malformed message from rank 1: "), std::string::npos) << c.what << ": " << error;
    EXPECT_NE(error.find(c.expected), std::string::npos) << c.what << ": " << error;
  }
  // Sizes whose product overflows int64 are caught as they multiply, not after.
  auto words = valid_words();
  words[t0 + 2] = 4;
  for (int k = 0; k < 4; ++k) words[t0 + 3 + k] = int64_t{1} << 20;
  EXPECT_NE(decode_error(words).find("tensor 0 shape"), std::string::npos);
  // An undefined slot (tensor 1) is not read further, whatever its other words say.
  words = valid_words();
  words[t1 + 1] = 99;
  EXPECT_EQ(decode_error(words), "");
  words.pop_back();
  EXPECT_NE(decode_error(words).find("header words"), std::string::npos);
}

TEST(RuntimeWireHeader, KindNames) {
  EXPECT_STREQ(message_kind_name(MessageKind::noise), "noise");
  EXPECT_STREQ(message_kind_name(static_cast<MessageKind>(9)), "images");
  EXPECT_STREQ(message_kind_name(static_cast<MessageKind>(kMessageKinds + 1)), "?");
}

TEST(RuntimeTransportChoice, AutoNcclAndMpi) {
  EXPECT_EQ(choose_transport("mpi", true, 4), "mpi");
  EXPECT_EQ(choose_transport("auto", false, 4), "mpi");
  EXPECT_EQ(choose_transport("auto", true, 1), "mpi");
  EXPECT_EQ(choose_transport("auto", true, 2), built_with_nccl() ? "nccl" : "mpi");
  try {
    choose_transport("nccl", false, 2);
    ADD_FAILURE() << "nccl on the CPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs --device cuda"), std::string::npos) << e.what();
  }
  if (built_with_nccl()) {
    EXPECT_EQ(choose_transport("nccl", true, 2), "nccl");
  } else {
    EXPECT_THROW(choose_transport("nccl", true, 2), Error);
  }
  EXPECT_THROW(choose_transport("gloo", true, 2), Error);
}

// A transport whose set-up is counted and whose send only checks the order.
class CountingTransport : public Transport {
 public:
  int setups = 0;
  void send(int, Message) override { check_connected(3, "send"); }
  Message receive(int) override { return {}; }
  Message receive_any(const std::vector<int>&) override { return {}; }
  bool has_message(int) override { return false; }
  void flush() override {}
  void report_failure(const std::string&) override {}
  uint64_t bytes_sent() const override { return 0; }
  uint64_t bytes_received() const override { return 0; }
  void all_to_all(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&, int) override {}
  std::vector<ExchangeSpan> take_exchange_spans() override { return {}; }
  uint64_t exchange_bytes_sent() const override { return 0; }
  uint64_t exchange_bytes_received() const override { return 0; }

 protected:
  void finish_connecting() override { ++setups; }
};

TEST(RuntimeTransportConnect, SetsUpOnceAndRefusesMessagesBeforeIt) {
  CountingTransport transport;
  try {
    transport.send(0, {});
    FAIL() << "a send before connect() was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3: internal error: a transport's send before connect()"),
              std::string::npos) << e.what();
  }
  EXPECT_FALSE(transport.connected());
  transport.connect();
  transport.connect();  // the second point a run may reach does nothing
  EXPECT_EQ(transport.setups, 1);
  EXPECT_TRUE(transport.connected());
  EXPECT_NO_THROW(transport.send(0, {}));
}

TEST(RuntimeComputeClock, OnTheCpuEachSpanGoesToItsStep) {
  ComputeClock clock(at::Device(at::kCPU));
  EXPECT_FALSE(clock.on_device());
  RankTimes times;
  for (int step : {0, 2, 2}) {
    clock.begin();
    // Work the host clock can see: a few milliseconds of matrix products.
    at::Tensor a = at::rand({128, 128});
    for (int i = 0; i < 20; ++i) a = at::mm(a, a).tanh();
    clock.end(step);
  }
  clock.collect(times, false, 1.0);
  ASSERT_EQ(times.per_step.size(), 3u);
  EXPECT_GT(times.per_step[0].compute_seconds, 0);
  EXPECT_EQ(times.per_step[1].compute_seconds, 0);
  EXPECT_GT(times.per_step[2].compute_seconds, 0);
  EXPECT_DOUBLE_EQ(times.compute_seconds,
                   times.per_step[0].compute_seconds + times.per_step[2].compute_seconds);
  // Collected spans are not counted twice.
  const double total = times.compute_seconds;
  clock.collect(times, true, 1.0);
  EXPECT_DOUBLE_EQ(times.compute_seconds, total);
  EXPECT_THROW(clock.end(0), Error);  // end() without begin()
}

}  // namespace
}  // namespace dp::runtime
