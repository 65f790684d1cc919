#include "tools/fake_scheduler/scheduler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "client/group_client.h"
#include "client/shared_tensor.h"
#include "client/tensor.h"
#include "tools/fake_scheduler/channel_lane.h"
#include "tools/fake_scheduler/draft_tree.h"
#include "tools/fake_scheduler/input_generator.h"
#include "tools/fake_scheduler/sequence_model.h"
#include "verify/mla_dims.h"

namespace verifyd::sched {
namespace {

// A daemon may compute LSE in another order than the reference; its values are ln of sums over
// hundreds of terms, so 1e-2 absolute is far above rounding and far below any real bug.
constexpr double kMaxLseError = 1e-2;

struct Geometry {
  int layers = 0;
  int heads = 0;
  int max_tree_nodes = 0;
  float scale = 0;
  bool fp8 = false;  // the daemons store fp8 rows (Stats kv_dtype): the models quantize alike
};

struct SequenceState {
  SequenceState(uint64_t id, int index, int layers, bool fp8, uint64_t seed)
      : model(id, layers, fp8), index(index), rng(seed * 0x9e3779b97f4a7c15ull + index) {}
  SequenceModel model;
  int index;
  std::mt19937_64 rng;
  TreeKind tree_kind = TreeKind::kChain;
  // The path chosen at the end of the last step; rides on the next step's layer-0 Verify.
  std::optional<std::vector<int32_t>> commit_to_send;
};

using Group = std::vector<SequenceState*>;

// A worker's shared-memory regions, one per rank; empty when tensors travel inline.
using RankRegions = std::vector<SharedMemoryRegion>;
using RankLanes = std::vector<std::unique_ptr<ChannelLane>>;

class Run {
 public:
  Run(const SchedulerConfig& config, GroupClient& ranks, const Geometry& geometry)
      : config_(config), ranks_(ranks), g_(geometry) {}

  SchedulerReport Execute(std::vector<std::unique_ptr<SequenceState>>& sequences);

 private:
  void Worker(int thread, const std::vector<Group>& groups);
  // One region per rank, large enough for any Append or Verify of this worker.
  bool CreateRegions(const std::vector<Group>& groups, RankRegions& regions);
  bool Prefill(SequenceState& s, RankRegions& regions);
  bool Step(const Group& group, int step, RankRegions& regions, RankLanes& lanes);
  bool OpenLanes(const std::vector<Group>& groups, RankLanes& lanes);
  // Checks one rank's answer to a layer's Verify against the models; q is that rank's queries,
  // region the rank's shared memory when the outputs are there.
  bool CheckVerify(const Group& group, const std::vector<int>& offsets, int step, int layer,
                   float scale, bool want_lse, int rank, std::vector<bf16_bits>& q,
                   const v1::VerifyResponse& response, const SharedMemoryRegion* region);
  // "rank r: " when there are several ranks, "" otherwise.
  std::string RankPrefix(int rank) const {
    return ranks_.size() > 1 ? absl::StrCat("rank ", rank, ": ") : "";
  }
  bool Finish(SequenceState& s);
  void Operator();
  bool Fail(std::string message);
  bool Aborted() const { return abort_.load(std::memory_order_relaxed); }

  const SchedulerConfig& config_;
  GroupClient& ranks_;  // one rank: a plain single-daemon run
  const Geometry g_;
  std::atomic<bool> abort_{false};
  std::unique_ptr<std::atomic<int>[]> progress_;  // steps finished, per worker
  int workers_ = 0;

  std::mutex mu_;  // guards everything below
  std::vector<std::string> failures_;
  std::vector<double> latencies_us_;
  SchedulerReport report_;
};

bool Run::Fail(std::string message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failures_.size() < 20) failures_.push_back(std::move(message));
  abort_ = true;
  return false;
}

bool Run::CreateRegions(const std::vector<Group>& groups, RankRegions& regions) {
  size_t largest_batch = 1;
  for (const Group& g : groups) largest_batch = std::max(largest_batch, g.size());
  const int64_t nodes =
      static_cast<int64_t>(largest_batch) * std::min(config_.tree_max, g_.max_tree_nodes);
  const uint64_t bytes =
      std::max<uint64_t>(SharedVerifyBytes(nodes, g_.heads, /*return_lse=*/true),
                         static_cast<uint64_t>(config_.prefill_max) * g_.layers * kKvDim * 2);
  for (int r = 0; r < ranks_.size(); ++r) {
    auto created = ranks_.rank(r).CreateSharedMemory(bytes);
    if (!created.ok()) {
      return Fail(absl::StrCat(RankPrefix(r), "CreateSharedMemory(", bytes,
                               "): ", created.status().ToString()));
    }
    regions.push_back(*std::move(created));
  }
  return true;
}

bool Run::OpenLanes(const std::vector<Group>& groups, RankLanes& lanes) {
  size_t largest_batch = 1;
  for (const Group& g : groups) largest_batch = std::max(largest_batch, g.size());
  const int64_t nodes =
      static_cast<int64_t>(largest_batch) * std::min(config_.tree_max, g_.max_tree_nodes);
  const uint64_t bytes = SharedVerifyBytes(nodes, g_.heads, /*return_lse=*/true);
  for (int r = 0; r < ranks_.size(); ++r) {
    auto lane = ChannelLane::Open(ranks_.rank(r), bytes, config_.device);
    if (!lane.ok()) {
      return Fail(absl::StrCat(RankPrefix(r), "opening a channel: ", lane.status().ToString()));
    }
    lanes.push_back(*std::move(lane));
  }
  return true;
}

bool Run::Prefill(SequenceState& s, RankRegions& regions) {
  const int64_t tokens =
      config_.prefill_min +
      static_cast<int64_t>(s.rng() % (config_.prefill_max - config_.prefill_min + 1));
  const size_t per_layer = static_cast<size_t>(tokens) * kKvDim;
  std::vector<bf16_bits> kv(per_layer * g_.layers);
  for (int l = 0; l < g_.layers; ++l) {
    for (int64_t t = 0; t < tokens; ++t) {
      FillRow({RowKey::kPrefixKv, config_.seed, static_cast<uint64_t>(s.index),
               static_cast<uint64_t>(l), static_cast<uint64_t>(t)},
              kKvAmplitude, absl::MakeSpan(kv).subspan(l * per_layer + t * kKvDim, kKvDim));
    }
  }
  // A third of the sequences prefill one layer per call, as a pipelined prefill would: the
  // committed length is the minimum fill over layers, reached only by the last call.
  const bool per_layer_calls = s.rng() % 3 == 0;
  const uint64_t id = s.model.id();
  // Every rank stores the whole latent KV (it is shared by all heads), so prefill is a broadcast.
  auto append = [&](uint32_t layer_begin, int64_t layer_count, absl::Span<const bf16_bits> rows,
                    uint64_t want_committed) {
    v1::AppendRequest request;
    request.set_sequence_id(id);
    request.set_layer_begin(layer_begin);
    // SPEC §2: the first call creates the sequence, a later per-layer call writes into layers that
    // hold nothing yet; an expiry between the calls fails instead of re-creating the sequence.
    const AppendPosition at = layer_begin == 0 ? AppendPosition::Create() : AppendPosition::Fill(0);
    SetExpectedPosition(at, &request);
    std::vector<absl::StatusOr<v1::AppendResponse>> results;
    if (regions.empty()) {
      const int64_t shape[] = {layer_count, tokens, kKvDim};
      *request.mutable_kv() = *tensor::MakeBf16(shape, rows);
      results = ranks_.Append(request);
    } else {
      results = ranks_.ForEachRank<v1::AppendResponse>([&](int r, Client& c) {
        return c.AppendKvShared(id, layer_begin, layer_count, tokens, rows, at, regions[r]);
      });
    }
    for (int r = 0; r < ranks_.size(); ++r) {
      if (!results[r].ok()) {
        return Fail(absl::StrCat(RankPrefix(r), "sequence ", id,
                                 " prefill: ", results[r].status().ToString()));
      }
      if (results[r]->committed_length() != want_committed) {
        return Fail(absl::StrCat(RankPrefix(r), "sequence ", id, " prefill of ", tokens,
                                 " tokens into layers [", layer_begin, ", ",
                                 layer_begin + layer_count,
                                 "): committed_length = ", results[r]->committed_length(),
                                 ", want ", want_committed, " (the minimum fill over layers)"));
      }
    }
    return true;
  };
  if (per_layer_calls) {
    for (int l = 0; l < g_.layers; ++l) {
      const uint64_t want = l + 1 < g_.layers ? 0 : static_cast<uint64_t>(tokens);
      if (!append(l, 1, absl::MakeConstSpan(kv).subspan(l * per_layer, per_layer), want)) {
        return false;
      }
    }
  } else if (!append(0, g_.layers, kv, static_cast<uint64_t>(tokens))) {
    return false;
  }
  s.model.Append(tokens, kv);
  std::lock_guard<std::mutex> lock(mu_);
  report_.prefill_tokens += tokens;
  return true;
}

bool Run::Step(const Group& group, int step, RankRegions& regions, RankLanes& lanes) {
  // The model applies last step's commit now: the daemon applies it before this step's Verify.
  std::vector<int> offsets = {0};  // node offsets of each sequence in the batch
  for (SequenceState* s : group) {
    if (s->commit_to_send) s->model.Commit(*s->commit_to_send);
    const int hi = std::min(config_.tree_max, g_.max_tree_nodes);
    const int lo = std::min(config_.tree_min, hi);
    const int nodes = lo + static_cast<int>(s->rng() % (hi - lo + 1));
    const uint64_t pick = s->rng() % 4;
    s->tree_kind = pick == 0   ? TreeKind::kChain
                   : pick == 3 ? TreeKind::kForest
                               : TreeKind::kBestFirst;
    s->model.StartTree(MakeDraftTree(s->tree_kind, nodes, s->rng));
    offsets.push_back(offsets.back() + nodes);
  }
  const int total_q = offsets.back();
  const int H = g_.heads;

  for (int layer = 0; layer < g_.layers; ++layer) {
    v1::VerifyRequest request;
    request.set_layer(layer);
    const bool want_lse = (step + layer) % 3 == 0;
    request.set_return_lse(want_lse);
    float scale = g_.scale;
    if ((step * 7 + layer) % 5 == 0) {  // exercise the per-request override
      scale = g_.scale * 1.25f;
      request.set_softmax_scale(scale);
    }
    std::vector<bf16_bits> tree_kv(static_cast<size_t>(total_q) * kKvDim);
    // Rank r holds heads [r*H, (r+1)*H) of the model: its queries are those heads' rows.
    std::vector<std::vector<bf16_bits>> q(
        ranks_.size(), std::vector<bf16_bits>(static_cast<size_t>(total_q) * H * kKvDim));
    for (size_t b = 0; b < group.size(); ++b) {
      SequenceState& s = *group[b];
      v1::VerifySequence* seq = request.add_sequences();
      seq->set_sequence_id(s.model.id());
      seq->mutable_parents()->Add(s.model.parents().begin(), s.model.parents().end());
      if (layer == 0 && s.commit_to_send) {
        seq->mutable_commit_previous()->set_commit_length(s.commit_to_send->size());
        seq->mutable_commit_previous()->mutable_accepted_path()->Add(s.commit_to_send->begin(),
                                                                     s.commit_to_send->end());
      }
      for (int i = 0; i < offsets[b + 1] - offsets[b]; ++i) {
        const uint64_t row = offsets[b] + i;
        FillRow(
            {RowKey::kTreeKv, config_.seed, static_cast<uint64_t>(s.index),
             static_cast<uint64_t>(layer), static_cast<uint64_t>(step), static_cast<uint64_t>(i)},
            kKvAmplitude, absl::MakeSpan(tree_kv).subspan(row * kKvDim, kKvDim));
        for (int r = 0; r < ranks_.size(); ++r) {
          for (int h = 0; h < H; ++h) {
            FillRow({RowKey::kQuery, config_.seed, static_cast<uint64_t>(s.index),
                     static_cast<uint64_t>(layer), static_cast<uint64_t>(step),
                     static_cast<uint64_t>(i), static_cast<uint64_t>(r * H + h)},
                    kQueryAmplitude, absl::MakeSpan(q[r]).subspan((row * H + h) * kKvDim, kKvDim));
          }
        }
      }
      s.model.SetTreeKv(layer, absl::MakeConstSpan(tree_kv).subspan(
                                   offsets[b] * kKvDim, (offsets[b + 1] - offsets[b]) * kKvDim));
    }
    const int64_t q_shape[] = {total_q, H, kKvDim};
    const int64_t kv_shape[] = {total_q, kKvDim};
    std::vector<absl::StatusOr<v1::VerifyResponse>> responses;
    absl::Time start;
    if (!lanes.empty()) {
      // The data plane: descriptors on a channel, tensors in registered memory (plans/0017).
      std::vector<int64_t> committed;
      for (SequenceState* s : group) committed.push_back(s->model.committed());
      start = absl::Now();
      responses = ranks_.ForEachRank<v1::VerifyResponse>(
          [&](int r, Client&) -> absl::StatusOr<v1::VerifyResponse> {
            return lanes[r]->Verify(request, q[r], tree_kv, H, committed);
          });
    } else if (regions.empty()) {
      *request.mutable_tree_kv() = *tensor::MakeBf16(kv_shape, tree_kv);
      std::vector<v1::VerifyRequest> requests(ranks_.size(), request);
      for (int r = 0; r < ranks_.size(); ++r)
        *requests[r].mutable_q() = *tensor::MakeBf16(q_shape, q[r]);
      start = absl::Now();
      responses = ranks_.Verify(requests);
    } else {
      // Placing the tensors in the region is part of the call's cost, as encoding is inline.
      start = absl::Now();
      responses = ranks_.ForEachRank<v1::VerifyResponse>(
          [&](int r, Client& c) -> absl::StatusOr<v1::VerifyResponse> {
            auto result = c.VerifyShared(request, q[r], tree_kv, regions[r]);
            if (!result.ok()) return result.status();
            return std::move(result->response);
          });
    }
    const double micros = absl::ToDoubleMicroseconds(absl::Now() - start);
    for (SequenceState* s : group) s->commit_to_send.reset();
    for (int r = 0; r < ranks_.size(); ++r) {
      if (!responses[r].ok()) {
        return Fail(absl::StrCat(RankPrefix(r), "step ", step, " layer ", layer, " (batch of ",
                                 group.size(), ", sequence ", group[0]->model.id(),
                                 " first): ", responses[r].status().ToString()));
      }
      if (!CheckVerify(group, offsets, step, layer, scale, want_lse, r, q[r], *responses[r],
                       regions.empty() ? nullptr : &regions[r])) {
        return false;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    latencies_us_.push_back(micros);
    report_.verifies += 1;
    report_.verified_trees += static_cast<int64_t>(group.size()) * ranks_.size();
  }

  int64_t committed = 0;
  for (SequenceState* s : group) {
    s->commit_to_send = PickAcceptedPath(s->model.parents(), s->rng);
    committed += static_cast<int64_t>(s->commit_to_send->size());
  }
  std::lock_guard<std::mutex> lock(mu_);
  report_.sequence_steps += static_cast<int64_t>(group.size());
  report_.committed_tokens += committed;
  return true;
}

bool Run::CheckVerify(const Group& group, const std::vector<int>& offsets, int step, int layer,
                      float scale, bool want_lse, int rank, std::vector<bf16_bits>& q,
                      const v1::VerifyResponse& response, const SharedMemoryRegion* region) {
  const int H = g_.heads;
  const int total_q = offsets.back();
  const std::string where =
      absl::StrCat(RankPrefix(rank), "step ", step, " layer ", layer, " (batch of ", group.size(),
                   ", sequence ", group[0]->model.id(), " first)");
  const int64_t out_shape[] = {total_q, H, kVDim};
  if (region != nullptr &&
      (response.out().data_case() != v1::Tensor::kSharedMemory ||
       (want_lse && response.lse().data_case() != v1::Tensor::kSharedMemory))) {
    return Fail(absl::StrCat(where, ": out/lse came inline, asked in shared memory"));
  }
  auto out = tensor::ReadBf16(response.out(), region, "out", out_shape);
  if (!out.ok()) return Fail(absl::StrCat(where, ": ", out.status().ToString()));
  std::vector<float> lse;
  if (want_lse) {
    const int64_t lse_shape[] = {total_q, H};
    auto parsed = tensor::ReadFp32(response.lse(), region, "lse", lse_shape);
    if (!parsed.ok()) return Fail(absl::StrCat(where, ": ", parsed.status().ToString()));
    lse = std::move(*parsed);
  }
  if (response.committed_length_size() != static_cast<int>(group.size())) {
    return Fail(absl::StrCat(where, ": committed_length has ", response.committed_length_size(),
                             " entries, want ", group.size()));
  }

  double worst = 0;
  for (size_t b = 0; b < group.size(); ++b) {
    SequenceModel& m = group[b]->model;
    const int nodes = offsets[b + 1] - offsets[b];
    const std::string seq_where =
        absl::StrCat(RankPrefix(rank), "sequence ", m.id(), " step ", step, " layer ", layer,
                     " (n = ", m.committed(), ", Q = ", nodes, ", ",
                     TreeKindName(group[b]->tree_kind), ", scale ", scale, ")");
    if (response.committed_length(b) != static_cast<uint64_t>(m.committed())) {
      return Fail(absl::StrCat(seq_where, ": committed_length = ", response.committed_length(b),
                               ", want ", m.committed()));
    }
    const auto seq_q = absl::MakeSpan(q).subspan(static_cast<size_t>(offsets[b]) * H * kKvDim,
                                                 static_cast<size_t>(nodes) * H * kKvDim);
    if (step == config_.corrupt_reference_at_step && layer == 0 && b == 0 && rank == 0) {
      // Element 0 of every query row of this sequence: scores move by up to ~3.6.
      for (size_t r = 0; r < static_cast<size_t>(nodes) * H; ++r) {
        seq_q[r * kKvDim] = FloatToBf16(Bf16ToFloat(seq_q[r * kKvDim]) + 50.0f);
      }
    }
    std::vector<bf16_bits> want_out;
    std::vector<float> want_lse;
    absl::Status ref = m.Reference(layer, seq_q, H, scale, &want_out, &want_lse);
    if (!ref.ok()) return Fail(absl::StrCat(seq_where, ": reference: ", ref.ToString()));
    const auto got = absl::MakeConstSpan(*out).subspan(static_cast<size_t>(offsets[b]) * H * kVDim,
                                                       want_out.size());
    const double err = RelativeError(got, want_out);
    worst = std::max(worst, err);
    if (!(err <= config_.max_relative_error)) {
      return Fail(absl::StrCat("MISMATCH ", seq_where, ": relative error ", err, " > ",
                               config_.max_relative_error, "; worst ", WorstElement(got, want_out),
                               " (element = (node * H + head) * 512 + dim)"));
    }
    for (size_t k = 0; !lse.empty() && k < want_lse.size(); ++k) {
      const double d = std::fabs(static_cast<double>(lse[offsets[b] * H + k]) - want_lse[k]);
      if (!(d <= kMaxLseError)) {
        return Fail(absl::StrCat("MISMATCH ", seq_where, ": lse[", k,
                                 "] = ", lse[offsets[b] * H + k], ", want ", want_lse[k]));
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  report_.max_relative_error = std::max(report_.max_relative_error, worst);
  return true;
}

bool Run::Finish(SequenceState& s) {
  const uint64_t id = s.model.id();
  if (s.commit_to_send) {
    const auto results = ranks_.Commit(id, *s.commit_to_send);
    s.model.Commit(*s.commit_to_send);
    s.commit_to_send.reset();
    for (int r = 0; r < ranks_.size(); ++r) {
      if (!results[r].ok()) {
        return Fail(absl::StrCat(RankPrefix(r), "sequence ", id,
                                 " final Commit: ", results[r].status().ToString()));
      }
      if (results[r]->committed_length() != static_cast<uint64_t>(s.model.committed())) {
        return Fail(absl::StrCat(RankPrefix(r), "sequence ", id,
                                 " final Commit: committed_length = ",
                                 results[r]->committed_length(), ", want ", s.model.committed()));
      }
    }
  }
  if (!config_.release_at_end) {
    std::lock_guard<std::mutex> lock(mu_);
    report_.kept_sequences.push_back(id);
    return true;
  }
  const auto released = ranks_.Release(id);
  for (int r = 0; r < ranks_.size(); ++r) {
    if (!released[r].ok()) {
      return Fail(absl::StrCat(RankPrefix(r), "sequence ", id,
                               " Release: ", released[r].status().ToString()));
    }
    if (released[r]->freed_slots() != static_cast<uint64_t>(s.model.committed())) {
      return Fail(absl::StrCat(RankPrefix(r), "sequence ", id,
                               " Release: freed_slots = ", released[r]->freed_slots(),
                               ", want the ", s.model.committed(), " committed tokens"));
    }
  }
  return true;
}

void Run::Worker(int thread, const std::vector<Group>& groups) {
  // Sequences of one worker are interleaved step by step, so they grow side by side in the pool
  // (and fragment it) as a real batch does.
  RankRegions regions;  // released (ReleaseSharedMemory) when the worker ends
  if (config_.shared_memory && !CreateRegions(groups, regions)) return;
  RankLanes lanes;  // channels closed and memory released when the worker ends
  if (config_.channel && !OpenLanes(groups, lanes)) return;
  for (const Group& g : groups)
    for (SequenceState* s : g)
      if (Aborted() || !Prefill(*s, regions)) return;
  for (int step = 0; step < config_.steps; ++step) {
    for (const Group& g : groups)
      if (Aborted() || !Step(g, step, regions, lanes)) return;
    progress_[thread].store(step + 1);
  }
  for (const Group& g : groups)
    for (SequenceState* s : g)
      if (Aborted() || !Finish(*s)) return;
}

void Run::Operator() {
  // Waits until every worker has finished compact_at_step steps, then compacts while the others
  // keep stepping.
  for (;;) {
    if (Aborted()) return;
    int slowest = config_.steps;
    for (int t = 0; t < workers_; ++t) slowest = std::min(slowest, progress_[t].load());
    if (slowest >= config_.compact_at_step) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  // Every rank compacts at once, as an operator's timer would fire on every GPU.
  const auto results = ranks_.ForEachRank<v1::CompactionStatus>(
      [&](int, Client& c) -> absl::StatusOr<v1::CompactionStatus> {
        auto op = c.Compact(config_.compact_budget_bytes);
        if (!op.ok()) return op.status();
        return c.WaitCompaction(op->operation_id(), absl::Milliseconds(10));
      });
  for (int r = 0; r < ranks_.size(); ++r) {
    if (!results[r].ok()) {
      Fail(absl::StrCat(RankPrefix(r), "Compact: ", results[r].status().ToString()));
      return;
    }
    const v1::CompactionStatus& done = *results[r];
    if (r == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      report_.compaction = done;
    }
    if (done.state() != v1::CompactionStatus::DONE) {
      Fail(absl::StrCat(RankPrefix(r), "compaction ", done.operation_id(), " ended ",
                        v1::CompactionStatus::State_Name(done.state()), ": ", done.error()));
    } else if (config_.compact_budget_bytes > 0 &&
               done.bytes_moved() > config_.compact_budget_bytes) {
      Fail(absl::StrCat(RankPrefix(r), "compaction moved ", done.bytes_moved(),
                        " bytes, over its budget of ", config_.compact_budget_bytes));
    }
  }
}

SchedulerReport Run::Execute(std::vector<std::unique_ptr<SequenceState>>& sequences) {
  std::vector<Group> groups;
  for (size_t i = 0; i < sequences.size(); i += config_.batch) {
    Group& g = groups.emplace_back();
    for (size_t j = i; j < std::min(sequences.size(), i + config_.batch); ++j)
      g.push_back(sequences[j].get());
  }
  workers_ = std::min<int>(config_.threads, static_cast<int>(groups.size()));
  std::vector<std::vector<Group>> per_worker(workers_);
  for (size_t i = 0; i < groups.size(); ++i) per_worker[i % workers_].push_back(groups[i]);
  progress_ = std::make_unique<std::atomic<int>[]>(workers_);
  for (int t = 0; t < workers_; ++t) progress_[t] = 0;

  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < workers_; ++t) threads.emplace_back([&, t] { Worker(t, per_worker[t]); });
  std::thread op;
  if (config_.compact_at_step >= 0) op = std::thread([&] { Operator(); });
  for (std::thread& t : threads) t.join();
  if (op.joinable()) op.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  std::lock_guard<std::mutex> lock(mu_);
  report_.wall_seconds = seconds;
  report_.verify_latency = Summarize(latencies_us_);
  report_.failures = failures_;
  return report_;
}

}  // namespace

absl::StatusOr<SchedulerReport> RunScheduler(const SchedulerConfig& config) {
  if (config.sequences < 1 || config.steps < 0 || config.threads < 1 || config.batch < 1 ||
      config.prefill_min < 1 || config.prefill_max < config.prefill_min || config.tree_min < 1 ||
      config.tree_max < config.tree_min) {
    return absl::InvalidArgumentError(
        "need sequences >= 1, steps >= 0, threads >= 1, batch >= 1, 1 <= prefill min <= max, "
        "1 <= tree min <= max");
  }
  if (config.targets.empty()) return absl::InvalidArgumentError("no target daemon");
  ClientOptions options;
  options.max_message_bytes = config.max_message_bytes;
  options.default_deadline = absl::Seconds(config.deadline_seconds);
  auto ranks = GroupClient::Connect(config.targets, options);
  if (!ranks.ok()) return ranks.status();
  const auto stats = (*ranks)->Stats();
  VERIFYD_RETURN_IF_ERROR(GroupClient::FirstError(stats));
  const v1::StatsResponse& s0 = *stats[0];
  Geometry g{static_cast<int>(s0.layers()), static_cast<int>(s0.heads()),
             static_cast<int>(s0.max_tree_nodes()), s0.softmax_scale(), s0.kv_dtype() == "fp8"};
  if (g.layers < 1 || g.heads < 1 || g.max_tree_nodes < 1 || !(g.scale > 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Stats reports layers = ", g.layers, ", heads = ", g.heads, ", max_tree_nodes = ",
        g.max_tree_nodes, ", softmax_scale = ", g.scale, "; all must be > 0"));
  }
  // Tensor-parallel ranks serve one model: the same layers, heads per rank, tree limit and scale.
  for (size_t r = 1; r < stats.size(); ++r) {
    const v1::StatsResponse& s = *stats[r];
    if (s.layers() != s0.layers() || s.heads() != s0.heads() ||
        s.max_tree_nodes() != s0.max_tree_nodes() || s.softmax_scale() != s0.softmax_scale() ||
        s.kv_dtype() != s0.kv_dtype()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " (", config.targets[r], ") has layers/heads/max_tree_nodes/scale/kv_dtype ",
          s.layers(), "/", s.heads(), "/", s.max_tree_nodes(), "/", s.softmax_scale(), "/",
          s.kv_dtype(), "; rank 0 has ", s0.layers(), "/", s0.heads(), "/", s0.max_tree_nodes(),
          "/", s0.softmax_scale(), "/", s0.kv_dtype()));
    }
  }
  std::vector<std::unique_ptr<SequenceState>> sequences;
  const uint64_t id_base = (config.seed & 0xffffffffffull) << 20;
  for (int i = 0; i < config.sequences; ++i) {
    sequences.push_back(
        std::make_unique<SequenceState>(id_base + i + 1, i, g.layers, g.fp8, config.seed));
  }
  Run run(config, **ranks, g);
  return run.Execute(sequences);
}

}  // namespace verifyd::sched
