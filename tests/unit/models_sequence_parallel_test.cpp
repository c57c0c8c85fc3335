// Ulysses sequence parallelism in the FLUX blocks (models/flux/sequence_parallel.h): K members, each on its own
// thread with an in-process exchange, hold shards of the text and image tokens and must give the unsharded
// forward's output (and so diffusers'), for head counts and token counts that split evenly and unevenly.
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <iostream>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "fixtures/random_model.h"
#include "io/safetensors.h"
#include "io/torch_tensors.h"
#include "models/flux/flux_transformer.h"
#include "models/flux/sequence_parallel.h"
#include "placement/mesh.h"
#include "test_support.h"

namespace dp::models {
namespace {

// K members in one process: an all-to-all is two barriers, with each member copying what the others posted in
// between. A member that never arrives fails the others after a bound instead of hanging the test.
class InProcessGroup {
 public:
  explicit InProcessGroup(int members) : posted_(static_cast<size_t>(members)) {
    for (int k = 0; k < members; ++k) members_.push_back(std::make_unique<Member>(*this, k));
  }
  flux::SequenceExchange* member(int k) { return members_[static_cast<size_t>(k)].get(); }
  int64_t exchanges() const { return exchanges_; }

 private:
  class Member : public flux::SequenceExchange {
   public:
    Member(InProcessGroup& group, int index) : group_(group), index_(index) {}
    void all_to_all(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv) override {
      DP_CHECK(send.size() == group_.posted_.size() && recv.size() == send.size(), "all_to_all with ", send.size(),
               " sends and ", recv.size(), " receives in a group of ", group_.posted_.size());
      group_.posted_[static_cast<size_t>(index_)] = &send;
      group_.barrier();
      for (size_t j = 0; j < recv.size(); ++j) recv[j].copy_((*group_.posted_[j])[static_cast<size_t>(index_)]);
      group_.barrier();
      if (index_ == 0) ++group_.exchanges_;
    }

   private:
    InProcessGroup& group_;
    int index_;
  };

  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++arrived_ == static_cast<int>(posted_.size())) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    DP_CHECK(changed_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != generation; }),
             "a member of the in-process group never reached the exchange");
  }

  std::vector<std::unique_ptr<Member>> members_;
  std::vector<const std::vector<at::Tensor>*> posted_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  int64_t exchanges_ = 0;
};

// Member k's shard as placement/mesh.h cuts it (the runtime's rule).
flux::SequenceShard shard_of(int k, int members, int64_t text_tokens, int64_t image_tokens, flux::SequenceExchange* exchange) {
  flux::SequenceShard shard;
  shard.index = k;
  shard.exchange = exchange;
  for (int j = 0; j < members; ++j) {
    shard.text_counts.push_back(placement::token_shard(text_tokens, members, j).count);
    shard.image_counts.push_back(placement::token_shard(image_tokens, members, j).count);
  }
  return shard;
}

// The whole transformer as `members` threads: embedders and head per token on each member's shard, temb per
// image on every member; returns the members' outputs concatenated along the image tokens.
at::Tensor run_sharded(const FluxTransformer& model, const FluxInputs& in, int members, int64_t* exchanges = nullptr) {
  const int64_t text = in.encoder_hidden_states.size(1), image = in.hidden_states.size(1);
  const flux::RotaryTables whole = model.rotary(in.txt_ids, in.img_ids);
  InProcessGroup group(members);
  std::vector<at::Tensor> out(static_cast<size_t>(members));
  std::vector<std::exception_ptr> failures(static_cast<size_t>(members));
  std::vector<std::thread> threads;
  for (int k = 0; k < members; ++k) {
    threads.emplace_back([&, k] {
      try {
        c10::InferenceMode guard;
        const flux::SequenceShard shard = shard_of(k, members, text, image, group.member(k));
        const auto text_rows = in.encoder_hidden_states.narrow(1, shard.text_first(k), shard.text_counts[static_cast<size_t>(k)]).contiguous();
        const auto image_rows = in.hidden_states.narrow(1, shard.image_first(k), shard.image_counts[static_cast<size_t>(k)]).contiguous();
        FluxActivations state{model.embed_image(image_rows), model.embed_text(text_rows),
                              model.embed_time(in.timestep, in.guidance, in.pooled_projections)};
        model.run_blocks(state, flux::shard_rotary(whole, shard), 0, model.config().num_blocks(), &shard);
        out[static_cast<size_t>(k)] = model.head(state);
      } catch (...) {
        failures[static_cast<size_t>(k)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures)
    if (f) std::rethrow_exception(f);
  if (exchanges != nullptr) *exchanges = group.exchanges();
  return at::cat(out, 1);
}

double relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  return (actual.to(at::kFloat) - expected.to(at::kFloat)).abs().max().item<double>() /
         expected.abs().max().item<double>();
}

// Compares K members with the unsharded forward: within 1e-6 of the output's scale (the bound), and
// says whether the arithmetic came out bit-identical.
void expect_sharded_equals_whole(const FluxTransformer& model, const FluxInputs& in, int members, const std::string& what) {
  const at::Tensor whole = model.forward(in);
  int64_t exchanges = 0;
  const at::Tensor sharded = run_sharded(model, in, members, &exchanges);
  ASSERT_EQ(sharded.sizes(), whole.sizes()) << what;
  const double error = relative_error(sharded, whole);
  EXPECT_LE(error, 1e-6) << what << " K=" << members;
  // Two all-to-alls around every block's attention.
  EXPECT_EQ(exchanges, 2 * model.config().num_blocks()) << what;
  std::cout << what << ", K=" << members << ": relative difference to unsharded " << error
            << (at::equal(sharded, whole) ? " (bit-identical)" : "") << "\n";
}

FluxInputs load_oracle_inputs(const std::string& dir, at::Tensor* expected) {
  auto file = io::SafetensorsFile::open(dir + "/io.safetensors");
  auto get = [&](const std::string& key) -> at::Tensor {
    const auto* info = file->find(key);
    return info == nullptr ? at::Tensor() : io::tensor_view(file, *info).clone();
  };
  FluxInputs in;
  in.hidden_states = get("input.hidden_states");
  in.encoder_hidden_states = get("input.encoder_hidden_states");
  in.pooled_projections = get("input.pooled_projections");
  in.timestep = get("input.timestep");
  in.img_ids = get("input.img_ids");
  in.txt_ids = get("input.txt_ids");
  in.guidance = get("input.guidance");
  *expected = get("output.fp32");
  return in;
}

// The diffusers oracle cases (tests/reference/cases_flux.py): 2 and 3 heads, uneven text shards.
TEST(SequenceParallel, OracleCasesEqualUnshardedAndDiffusers) {
  c10::InferenceMode guard;
  for (const std::string name : {"guidance_nonsquare", "no_guidance_batch2", "dev_like"}) {
    const std::string dir = dp::test::reference_dir() + "/flux/" + name;
    at::Tensor expected;
    const FluxInputs in = load_oracle_inputs(dir, &expected);
    const auto model = FluxTransformer::load(dir + "/transformer", at::kFloat, at::kCPU);
    const int heads = static_cast<int>(model.config().num_attention_heads);
    for (int members = 2; members <= heads; ++members) {
      if (heads % members != 0) continue;
      expect_sharded_equals_whole(model, in, members, name);
      EXPECT_LE(relative_error(run_sharded(model, in, members), expected), 1e-4) << name << " vs diffusers";
    }
  }
}

// Twelve heads allow K = 2, 3, 4 and 6; 7 text and 15 image tokens split unevenly for all of them.
TEST(SequenceParallel, TwelveHeadsSplitTwoThreeFourAndSixWays) {
  c10::InferenceMode guard;
  models::FluxConfig config = fixtures::tiny_flux_config();
  config.num_attention_heads = 12;
  config.attention_head_dim = 8;
  config.axes_dims_rope = {2, 2, 4};
  config.num_layers = 1;
  config.num_single_layers = 2;
  config.joint_attention_dim = 24;
  config.pooled_projection_dim = 20;
  const std::string dir = dp::test::temp_dir("sp-twelve-heads");
  fixtures::RandomWriteOptions options;
  options.seed = 11;
  fixtures::write_random_component(dir, fixtures::flux_transformer_component(config), options);
  const auto model = FluxTransformer::load(dir + "/transformer", at::kFloat, at::kCPU);
  at::manual_seed(5);
  const int64_t batch = 2, text = 7, rows = 3, columns = 5;
  FluxInputs in;
  in.hidden_states = at::randn({batch, rows * columns, config.in_channels});
  in.encoder_hidden_states = at::randn({batch, text, config.joint_attention_dim});
  in.pooled_projections = at::randn({batch, config.pooled_projection_dim});
  in.timestep = at::full({batch}, 0.6);
  in.guidance = at::full({batch}, 3.5);
  in.txt_ids = at::zeros({text, 3});
  in.img_ids = at::zeros({rows * columns, 3});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < columns; ++c) {
      in.img_ids[r * columns + c][1] = r;
      in.img_ids[r * columns + c][2] = c;
    }
  for (int members : {2, 3, 4, 6}) expect_sharded_equals_whole(model, in, members, "12 heads");
}

TEST(SequenceParallel, RotaryRowsFollowTheShard) {
  c10::InferenceMode guard;
  const flux::RotaryTables whole{at::arange(10).to(at::kFloat).unsqueeze(1).repeat({1, 4}),
                                 -at::arange(10).to(at::kFloat).unsqueeze(1).repeat({1, 4})};
  // 4 text and 6 image tokens over 3 members: text 2,1,1 and image 2,2,2.
  const flux::SequenceShard shard = shard_of(1, 3, 4, 6, nullptr);
  const flux::RotaryTables rows = flux::shard_rotary(whole, shard);
  // Member 1: text token 2, image tokens 2 and 3 (positions 4 + 2 and 4 + 3).
  EXPECT_TRUE(at::equal(rows.cos.select(1, 0), at::tensor({2.f, 6.f, 7.f})));
  EXPECT_TRUE(at::equal(rows.sin.select(1, 0), at::tensor({-2.f, -6.f, -7.f})));
}

TEST(SequenceParallel, RefusesWhatCannotBeSplit) {
  c10::InferenceMode guard;
  InProcessGroup group(2);
  const at::Tensor q = at::randn({1, 3, 3, 4});
  flux::SequenceShard shard = shard_of(0, 2, 2, 4, group.member(0));
  // Three heads over two members.
  EXPECT_THROW(flux::sequence_parallel_attention(q, q, q, shard), Error);
  // Tokens other than the member's share (1 text + 2 image), and a member without tokens.
  const at::Tensor q4 = at::randn({1, 4, 2, 4});
  EXPECT_THROW(flux::sequence_parallel_attention(q4, q4, q4, shard), Error);
  EXPECT_THROW(shard_of(0, 2, 1, 4, group.member(0)).check(), Error);
  shard.exchange = nullptr;
  EXPECT_THROW(shard.check(), Error);
}

}  // namespace
}  // namespace dp::models
