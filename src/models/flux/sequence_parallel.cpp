#include "models/flux/sequence_parallel.h"

#include <numeric>

#include "core/error.h"

namespace dp::models::flux {
namespace {

int64_t sum_before(const std::vector<int64_t>& counts, int member) {
  return std::accumulate(counts.begin(), counts.begin() + member, int64_t{0});
}

// Rows [first, first + count) of `t` along `dim`, for each of the (first, count) pairs, in order.
at::Tensor gather_rows(const at::Tensor& t, int64_t dim, const std::vector<std::pair<int64_t, int64_t>>& runs) {
  std::vector<at::Tensor> parts;
  for (const auto& [first, count] : runs)
    if (count > 0) parts.push_back(t.narrow(dim, first, count));
  return parts.size() == 1 ? parts.front().contiguous() : at::cat(parts, dim);
}

}  // namespace

int64_t SequenceShard::text_first(int member) const { return sum_before(text_counts, member); }
int64_t SequenceShard::image_first(int member) const { return sum_before(image_counts, member); }
int64_t SequenceShard::text_tokens() const { return sum_before(text_counts, size()); }
int64_t SequenceShard::image_tokens() const { return sum_before(image_counts, size()); }

void SequenceShard::check() const {
  DP_CHECK(size() >= 1 && image_counts.size() == text_counts.size(), "a sequence group of ", text_counts.size(),
           " text and ", image_counts.size(), " image shards");
  DP_CHECK(index >= 0 && index < size(), "member ", index, " of a sequence group of ", size());
  for (int j = 0; j < size(); ++j)
    DP_CHECK(text_counts[static_cast<size_t>(j)] >= 1 && image_counts[static_cast<size_t>(j)] >= 1, "member ", j,
             " of the sequence group holds ", text_counts[static_cast<size_t>(j)], " text and ",
             image_counts[static_cast<size_t>(j)], " image tokens; every member needs some of both");
  DP_CHECK(size() == 1 || exchange != nullptr, "a sequence group of ", size(), " members needs an exchange");
}

RotaryTables shard_rotary(const RotaryTables& whole, const SequenceShard& shard) {
  const int64_t text = shard.text_tokens();
  DP_CHECK(whole.cos.size(0) == text + shard.image_tokens(), "rotary tables of ", whole.cos.size(0),
           " positions for a sequence of ", text, " text and ", shard.image_tokens(), " image tokens");
  if (shard.size() == 1) return whole;
  const int k = shard.index;
  const std::vector<std::pair<int64_t, int64_t>> rows = {
      {shard.text_first(k), shard.text_counts[static_cast<size_t>(k)]},
      {text + shard.image_first(k), shard.image_counts[static_cast<size_t>(k)]}};
  return {gather_rows(whole.cos, 0, rows), gather_rows(whole.sin, 0, rows)};
}

at::Tensor sequence_parallel_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const SequenceShard& shard) {
  shard.check();
  const int members = shard.size();
  const int me = shard.index;
  const int64_t batch = q.size(0), heads = q.size(2), head_dim = q.size(3);
  DP_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.sizes() == v.sizes(), "q, k and v must be (B, tokens, heads, ",
           "head_dim) alike, got ", q.sizes(), ", ", k.sizes(), " and ", v.sizes());
  DP_CHECK(heads % members == 0, "a sequence group of ", members, " splits whole heads, but there are ", heads);
  DP_CHECK(q.size(1) == shard.local_tokens(me), "member ", me, " holds ", shard.local_tokens(me),
           " tokens but attention was given ", q.size(1));
  const int64_t my_heads = heads / members;
  const int64_t text = shard.text_tokens(), tokens = text + shard.image_tokens();

  // To member j: q, k and v of this member's tokens for j's heads, one tensor (3, B, local tokens, heads / K, D).
  std::vector<at::Tensor> send, recv;
  for (int j = 0; j < members; ++j) {
    const int64_t first_head = j * my_heads;
    send.push_back(at::stack({q.narrow(2, first_head, my_heads), k.narrow(2, first_head, my_heads),
                              v.narrow(2, first_head, my_heads)}));
    recv.push_back(at::empty({3, batch, shard.local_tokens(j), my_heads, head_dim}, q.options()));
  }
  shard.exchange->all_to_all(send, recv);
  send.clear();
  // The whole sequence in the unsharded order: every member's text tokens, then every member's image tokens. Keys
  // in the same order as on one device keep the softmax's sums in the same order too.
  std::vector<at::Tensor> parts;
  for (int j = 0; j < members; ++j) parts.push_back(recv[static_cast<size_t>(j)].narrow(2, 0, shard.text_counts[static_cast<size_t>(j)]));
  for (int j = 0; j < members; ++j)
    parts.push_back(recv[static_cast<size_t>(j)].narrow(2, shard.text_counts[static_cast<size_t>(j)],
                                                        shard.image_counts[static_cast<size_t>(j)]));
  const at::Tensor whole = at::cat(parts, 2);
  parts.clear();
  recv.clear();
  const at::Tensor attended = attention(whole[0], whole[1], whole[2]);  // (B, tokens, heads / K * D)
  DP_CHECK(attended.size(1) == tokens, "attention over ", attended.size(1), " of ", tokens, " tokens");

  // Back to member j: its tokens' rows of these heads; this member gets its tokens' rows of every member's heads.
  for (int j = 0; j < members; ++j) {
    send.push_back(gather_rows(attended, 1, {{shard.text_first(j), shard.text_counts[static_cast<size_t>(j)]},
                                             {text + shard.image_first(j), shard.image_counts[static_cast<size_t>(j)]}}));
    recv.push_back(at::empty({batch, shard.local_tokens(me), my_heads * head_dim}, attended.options()));
  }
  shard.exchange->all_to_all(send, recv);
  return at::cat(recv, 2);
}

at::Tensor group_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const SequenceShard* shard) {
  if (shard == nullptr || shard->size() == 1) return attention(q, k, v);
  return sequence_parallel_attention(q, k, v, *shard);
}

}  // namespace dp::models::flux
