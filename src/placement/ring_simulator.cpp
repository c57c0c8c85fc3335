#include "placement/ring_simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>

#include "core/error.h"
#include "placement/mesh.h"

namespace dp::placement {

double LinkModel::transfer_ms(int64_t bytes) const {
  return latency_us * 1e-3 + static_cast<double>(bytes) / (gb_per_s * 1e9) * 1e3;
}

double GroupExchange::ms(int64_t images) const {
  if (collectives == 0) return 0;
  return static_cast<double>(collectives) * link.latency_us * 1e-3 +
         static_cast<double>(bytes_per_image * images) / (link.gb_per_s * 1e9) * 1e3;
}

namespace {

// The presets, one direction of one link. Bandwidths are what a large message gets, latencies what a small
// one costs end to end (the figures a point-to-point test such as nccl-tests' sendrecv reports).
struct Preset {
  const char* name;
  double gb_per_s, latency_us;
  const char* source;
};
constexpr Preset kPresets[] = {
    // H100/H200 SXM: 18 NVLink-4 links, 900 GB/s per GPU counting both directions (NVIDIA's datasheet).
    {"nvlink", 450.0, 2.0, "NVLink 4 (H100/H200 SXM): 900 GB/s per GPU both ways, so 450 GB/s each way"},
    // PCIe 4.0 x16: 16 GT/s x 16 lanes with 128b/130b coding is 31.5 GB/s each way on paper; copies reach
    // about 25. A GPU-to-GPU message through a switch or the host costs a few microseconds.
    {"pcie", 25.0, 5.0, "PCIe 4.0 x16: 31.5 GB/s each way on paper, about 25 GB/s in practice"},
    // One HDR InfiniBand port: 200 Gb/s = 25 GB/s each way; RDMA latency about 1-2 us, plus NCCL's proxy.
    {"ib", 25.0, 3.0, "InfiniBand HDR, one 200 Gb/s port per GPU: 25 GB/s each way"},
};

}  // namespace

LinkModel link_preset(const std::string& name) {
  std::string known;
  for (const auto& p : kPresets) {
    if (name == p.name) return {p.name, p.gb_per_s, p.latency_us};
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  DP_FAIL("--link '", name, "' is not a link preset (", known, "); give --link-gbps and --link-latency-us instead");
}

std::string link_presets_help() {
  std::string text;
  for (const auto& p : kPresets)
    text += str(text.empty() ? "" : "\n", p.name, ": ", p.gb_per_s, " GB/s, ", p.latency_us, " us (", p.source, ")");
  return text;
}

namespace {

void check_input(const RingSimulationInput& in) {
  DP_CHECK(!in.stage_ranks.empty(), "the ring simulation needs at least one stage");
  DP_CHECK(in.stage_ranks.size() == in.stage_ms.size(), "the ring simulation got ", in.stage_ranks.size(),
           " stage rank(s) but ", in.stage_ms.size(), " stage time(s)");
  for (size_t i = 0; i < in.stage_ranks.size(); ++i) {
    DP_CHECK(in.stage_ranks[i] >= 0, "stage ", i, " has rank ", in.stage_ranks[i]);
    DP_CHECK(i == 0 || in.stage_ranks[i] != 0, "stage ", i, " is on rank 0; the coordinator can only run the "
             "first stage (it starts the ring)");
    for (size_t j = 0; j < i; ++j)
      DP_CHECK(in.stage_ranks[i] != in.stage_ranks[j], "rank ", in.stage_ranks[i], " runs stages ", j, " and ", i,
               "; the ring visits each rank once");
    DP_CHECK(std::isfinite(in.stage_ms[i]) && in.stage_ms[i] >= 0, "stage ", i, " (rank ", in.stage_ranks[i],
             ") has compute time ", in.stage_ms[i], " ms; it must be a non-negative number");
  }
  DP_CHECK(in.link.gb_per_s > 0 && std::isfinite(in.link.gb_per_s), "link bandwidth must be positive, got ",
           in.link.gb_per_s, " GB/s");
  DP_CHECK(in.link.latency_us >= 0 && std::isfinite(in.link.latency_us), "link latency must be non-negative, got ",
           in.link.latency_us, " us");
  DP_CHECK(in.images >= 1, "the simulation needs at least one image (prompts x images per prompt), got ", in.images);
  DP_CHECK(in.microbatch_size >= 1, "--microbatch-size must be at least 1, got ", in.microbatch_size);
  DP_CHECK(in.steps >= 1, "--steps must be at least 1, got ", in.steps);
  DP_CHECK(in.euler_ms >= 0 && std::isfinite(in.euler_ms), "--euler-ms must be non-negative, got ", in.euler_ms);
  DP_CHECK(in.max_in_flight >= 0, "--max-in-flight must be positive (or 0 for one per stage), got ", in.max_in_flight);
  for (int64_t bytes : {in.prompt_bytes_per_image, in.step_input_bytes_per_image, in.activation_bytes_per_image,
                        in.noise_bytes_per_image})
    DP_CHECK(bytes >= 0, "message sizes must be non-negative, got ", bytes, " bytes");
  const int k = in.sequence_parallel;
  DP_CHECK(k >= 1, "--sequence-parallel must be at least 1, got ", k);
  for (size_t i = 0; i < in.stage_ranks.size(); ++i)
    DP_CHECK(in.stage_ranks[i] % k == 0, "stage ", i, " starts at rank ", in.stage_ranks[i],
             ", which is not the first rank of a group of ", k, " (rank = group x ", k, " + shard)");
  DP_CHECK(in.stage_exchanges.empty() || in.stage_exchanges.size() == in.stage_ranks.size(), "the ring simulation got ",
           in.stage_exchanges.size(), " group exchange(s) for ", in.stage_ranks.size(), " stage(s)");
  for (const auto& e : in.stage_exchanges) {
    DP_CHECK(e.collectives >= 0 && e.bytes_per_image >= 0, "a group exchange must be non-negative, got ",
             e.collectives, " all-to-alls of ", e.bytes_per_image, " bytes");
    DP_CHECK(e.collectives == 0 || (e.link.gb_per_s > 0 && std::isfinite(e.link.gb_per_s) && e.link.latency_us >= 0 &&
                                    std::isfinite(e.link.latency_us)),
             "the all-to-all link '", e.link.name, "' needs a positive bandwidth and a non-negative latency, got ",
             e.link.gb_per_s, " GB/s and ", e.link.latency_us, " us");
  }
}

// The replay. Every stage rank and every link serves its work first come, first served, and every step
// takes the same path, so the order steps were submitted in is the order they reach every stage and link.
// A step can therefore be followed through the whole ring the moment rank 0 submits it.
class Replay {
 public:
  explicit Replay(const RingSimulationInput& in) : in_(in), stages_(in.stage_ranks.size()) {
    const int k = in_.sequence_parallel;
    // Shards rank 0 sends per message to the first group, and receives from the last: none of its own.
    scatter_ = first_on_coordinator() ? k - 1 : k;
    gather_ = in_.stage_ranks.back() == 0 ? k - 1 : k;
    const auto add_link = [&](int from, int to, int parallel, int peers) {
      links_.push_back({from, to, 0, 0, 0, parallel, peers});
    };
    if (scatter_ > 0) add_link(0, in_.stage_ranks.front() + (first_on_coordinator() ? 1 : 0), 1, scatter_);
    for (size_t i = 0; i + 1 < stages_; ++i) add_link(in_.stage_ranks[i], in_.stage_ranks[i + 1], k, 1);
    if (gather_ > 0) add_link(in_.stage_ranks.back() + (in_.stage_ranks.back() == 0 ? 1 : 0), 0, 1, gather_);
    link_free_.assign(links_.size(), 0.0);
    link_busy_.assign(links_.size(), 0.0);
    rank_free_.assign(stages_, 0.0);
    compute_.assign(stages_, 0.0);
    exchange_.assign(stages_, 0.0);
    exchange_bytes_.assign(stages_, 0);
  }

  RingSimulation run() {
    std::vector<int64_t> rows;
    for (int64_t first = 0; first < in_.images; first += in_.microbatch_size)
      rows.push_back(std::min(in_.microbatch_size, in_.images - first));
    const int64_t count = static_cast<int64_t>(rows.size());
    double now = 0;  // rank 0's clock
    // send_prompts for every microbatch, before the loop starts.
    if (scatter_ > 0) {
      for (int64_t m = 0; m < count; ++m) {
        const double through =
            send(0, 0, in_.prompt_bytes_per_image * rows[static_cast<size_t>(m)] * scatter_, now, false);
        if (!in_.transfers_overlap_compute) now = through;
      }
    }
    std::deque<int64_t> ready;
    for (int64_t m = 0; m < count; ++m) ready.push_back(m);
    std::vector<int> next_step(static_cast<size_t>(count), 0);
    const int depth = in_.max_in_flight > 0 ? in_.max_in_flight : static_cast<int>(stages_);
    double euler_total = 0;
    while (!ready.empty() || !returning_.empty()) {
      while (!ready.empty() && static_cast<int>(returning_.size()) < depth) {
        const int64_t m = ready.front();
        ready.pop_front();
        now = submit(m, next_step[static_cast<size_t>(m)], rows[static_cast<size_t>(m)], now);
      }
      const auto [m, back] = returning_.front();
      returning_.pop_front();
      now = std::max(now, back) + in_.euler_ms;
      euler_total += in_.euler_ms;
      if (++next_step[static_cast<size_t>(m)] < in_.steps) ready.push_back(m);
    }

    RingSimulation out;
    out.sequence_parallel = in_.sequence_parallel;
    out.microbatches = count;
    out.total_ms = now;
    out.images_per_s = now > 0 ? static_cast<double>(in_.images) / (now * 1e-3) : 0;
    double compute_sum = 0;
    for (size_t i = 0; i < stages_; ++i) {
      const double busy = compute_[i] + exchange_[i];
      compute_sum += busy;
      out.stages.push_back({in_.stage_ranks[i], compute_[i], now > 0 ? busy / now : 0, exchange_[i],
                            exchange_bytes_[i]});
    }
    out.bubble_fraction = now > 0 ? 1.0 - compute_sum / (static_cast<double>(stages_) * now) : 0;
    const double coordinator_busy =
        euler_total + (first_on_coordinator() ? compute_.front() + exchange_.front() : 0.0);
    out.coordinator_busy_fraction = now > 0 ? coordinator_busy / now : 0;
    for (size_t l = 0; l < links_.size(); ++l) {
      LinkTraffic traffic = links_[l];
      traffic.busy_fraction = now > 0 ? link_busy_[l] / now : 0;
      out.links.push_back(traffic);
    }
    return out;
  }

 private:
  bool first_on_coordinator() const { return in_.stage_ranks.front() == 0; }

  // Puts `bytes` on link `l` once the sender has them (at `ready`); returns when they have arrived.
  double send(size_t l, int step, int64_t bytes, double ready, bool every_step) {
    const double start = std::max(ready, link_free_[l]);
    const double duration = in_.link.transfer_ms(bytes);
    link_free_[l] = start + duration;
    link_busy_[l] += duration;
    links_[l].bytes_total += bytes;
    if (every_step && step == 0) links_[l].bytes_per_step += bytes;
    return start + duration;
  }

  // Rank 0 submits `step` of microbatch m at `now`: follows it round the ring, queues the time its noise is
  // back on rank 0, and returns rank 0's clock once submit() has returned.
  double submit(int64_t m, int step, int64_t rows, double now) {
    const double scale = static_cast<double>(rows) / static_cast<double>(in_.microbatch_size);
    size_t link = 0;
    double arrival = now;  // when the step's input is at the current stage's ranks
    double coordinator_free = now;
    if (scatter_ > 0) {
      arrival = send(link++, step, in_.step_input_bytes_per_image * rows * scatter_, now, true);
      if (!in_.transfers_overlap_compute) coordinator_free = arrival;
    }
    for (size_t i = 0; i < stages_; ++i) {
      const bool on_coordinator = i == 0 && first_on_coordinator();
      // Rank 0's own stage starts when its group has the inputs (at once with K = 1: arrival is now).
      const double start = on_coordinator ? arrival : std::max(arrival, rank_free_[i]);
      const double computed = start + in_.stage_ms[i] * scale;
      compute_[i] += computed - start;
      double done = computed;
      if (!in_.stage_exchanges.empty()) {
        const double exchange = in_.stage_exchanges[i].ms(rows);
        done += exchange;
        exchange_[i] += exchange;
        if (step == 0) exchange_bytes_[i] += in_.stage_exchanges[i].bytes_per_image * rows;
      }
      double sender_free = done;
      const bool last = i + 1 == stages_;
      if (!last) {
        arrival = send(link++, step, in_.activation_bytes_per_image * rows, done, true);
      } else if (gather_ > 0) {
        arrival = send(link++, step, in_.noise_bytes_per_image * rows * gather_, done, true);
      } else {
        arrival = done;  // one stage of one rank, rank 0: the noise never leaves it
      }
      if (!in_.transfers_overlap_compute && (!last || gather_ > 0)) sender_free = arrival;
      rank_free_[i] = sender_free;
      if (on_coordinator) coordinator_free = sender_free;
    }
    returning_.emplace_back(m, arrival);
    return coordinator_free;
  }

  const RingSimulationInput& in_;
  const size_t stages_;
  int scatter_ = 0, gather_ = 0;
  std::vector<LinkTraffic> links_;
  std::vector<double> link_free_, link_busy_, rank_free_, compute_, exchange_;
  std::vector<int64_t> exchange_bytes_;
  std::deque<std::pair<int64_t, double>> returning_;  // steps in flight, with the time their noise is back
};

}  // namespace

RingSimulation simulate_ring(const RingSimulationInput& input) {
  check_input(input);
  return Replay(input).run();
}

RingMessageBytes flux_ring_message_bytes(const models::FluxConfig& c, int64_t height, int64_t width,
                                         int64_t text_tokens, io::DType dtype, int sequence_parallel) {
  DP_CHECK(height > 0 && width > 0 && height % 16 == 0 && width % 16 == 0, "resolution ", height, "x", width,
           " must be positive multiples of 16");
  DP_CHECK(text_tokens > 0, "text tokens must be positive, got ", text_tokens);
  DP_CHECK(sequence_parallel >= 1, "--sequence-parallel must be at least 1, got ", sequence_parallel);
  const int64_t element = static_cast<int64_t>(io::dtype_size(dtype));
  // One rank's shards: the longest, which the first ranks hold (mesh.h); all the tokens for K = 1.
  text_tokens = token_shard(text_tokens, sequence_parallel, 0).count;
  const int64_t image_tokens = token_shard((height / 16) * (width / 16), sequence_parallel, 0).count;
  const int64_t d = c.inner_dim();
  RingMessageBytes bytes;
  bytes.prompts = element * (text_tokens * c.joint_attention_dim + c.pooled_projection_dim);
  bytes.step_inputs = element * (image_tokens * c.in_channels + 1) + (c.guidance_embeds ? 4 : 0);
  bytes.activations = element * (image_tokens * d + text_tokens * d + d);
  bytes.noise = element * image_tokens * c.output_channels();
  return bytes;
}

std::vector<double> flux_ring_stage_ms(const std::vector<TimedUnit>& units, const std::vector<RankStage>& stages) {
  DP_CHECK(units.size() >= 2 && units.front().name == "embedders" && units.back().name == "output",
           "stage times need the timed units of flux_timed_units (embedders, blocks, output)");
  DP_CHECK(!stages.empty(), "stage times need at least one ring stage");
  const int64_t blocks = static_cast<int64_t>(units.size()) - 2;
  std::vector<double> ms;
  for (const auto& s : stages) {
    DP_CHECK(s.first_block >= 0 && s.first_block < s.last_block && s.last_block <= blocks, "rank ", s.rank,
             " holds blocks [", s.first_block, ", ", s.last_block, ") of a transformer with ", blocks);
    double sum = 0;
    for (int64_t b = s.first_block; b < s.last_block; ++b) sum += units[static_cast<size_t>(b + 1)].ms;
    ms.push_back(sum);
  }
  ms.front() += units.front().ms;
  ms.back() += units.back().ms;
  return ms;
}

MapRanks map_ranks(const nlohmann::ordered_json& hf_device_map, const models::FluxConfig& config) {
  MapRanks out;
  for (const auto& item : hf_device_map.items())
    if (item.value().is_number_integer()) out.ranks = std::max(out.ranks, item.value().get<int>() + 1);
  try {
    out.stages = ring_stages(hf_device_map, config, out.ranks);
    for (size_t i = 1; i < out.stages.size(); ++i)
      DP_CHECK(out.stages[i].rank != 0, "rank 0 (the coordinator) holds blocks [", out.stages[i].first_block, ", ",
               out.stages[i].last_block, ") but not the first ones; it can only start the ring");
  } catch (const Error& e) {
    out.stages.clear();
    out.unsupported = e.what();
  }
  for (const auto& s : out.stages) out.gpus_with_blocks.push_back(s.rank);
  std::sort(out.gpus_with_blocks.begin(), out.gpus_with_blocks.end());
  return out;
}

nlohmann::ordered_json to_json(const LinkModel& link) {
  return {{"name", link.name}, {"gb_per_s", link.gb_per_s}, {"latency_us", link.latency_us}};
}

nlohmann::ordered_json to_json(const RingSimulation& s) {
  // The mesh's figures appear only with K > 1, so that K = 1 prints what it always has.
  const bool mesh = s.sequence_parallel > 1;
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const auto& st : s.stages) {
    nlohmann::ordered_json stage = {{"rank", st.rank}, {"compute_ms", st.compute_ms}, {"busy_fraction", st.busy_fraction}};
    if (mesh) {
      stage["group_ranks"] = {st.rank, st.rank + s.sequence_parallel - 1};
      stage["all_to_all_ms"] = st.all_to_all_ms;
      stage["all_to_all_bytes_per_step"] = st.all_to_all_bytes_per_step;
    }
    stages.push_back(stage);
  }
  nlohmann::ordered_json links = nlohmann::ordered_json::array();
  for (const auto& l : s.links) {
    nlohmann::ordered_json link = {{"from_rank", l.from_rank}, {"to_rank", l.to_rank},
                                   {"bytes_per_step", l.bytes_per_step}, {"bytes_total", l.bytes_total},
                                   {"busy_fraction", l.busy_fraction}};
    if (mesh) {
      link["parallel_links"] = l.parallel;
      link["peer_ranks"] = l.peers;
    }
    links.push_back(link);
  }
  nlohmann::ordered_json out = {{"microbatches", s.microbatches}, {"total_s", s.total_ms * 1e-3},
                                {"images_per_s", s.images_per_s}, {"bubble_fraction", s.bubble_fraction},
                                {"coordinator_busy_fraction", s.coordinator_busy_fraction}, {"stages", stages},
                                {"links", links}};
  if (mesh) out["sequence_parallel"] = s.sequence_parallel;
  return out;
}

nlohmann::ordered_json to_json(const MapRanks& r) {
  nlohmann::ordered_json ring = nlohmann::ordered_json::array();
  for (const auto& s : r.stages) {
    nlohmann::ordered_json stage = {{"rank", s.rank}, {"first_block", s.first_block}, {"last_block", s.last_block}};
    // Offloaded blocks this rank runs from host memory ("cpu") or the mmapped file ("disk").
    nlohmann::ordered_json offloaded = nlohmann::ordered_json::array();
    for (const auto& o : s.offloaded) offloaded.push_back({{"block", o.block}, {"tier", tier_name(o.tier)}});
    if (!offloaded.empty()) stage["offloaded"] = offloaded;
    stage["text"] = describe_stage(s);
    ring.push_back(stage);
  }
  nlohmann::ordered_json out = {{"ranks", r.ranks}, {"gpus_with_blocks", r.gpus_with_blocks},
                                {"launch", str("mpirun -np ", r.ranks)}, {"ring", ring}};
  if (!r.unsupported.empty()) out["unsupported"] = r.unsupported;
  return out;
}

}  // namespace dp::placement
