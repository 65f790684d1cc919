// KvStore: fragmentation statistics and compaction (plan + execute), run-granular. Strategy and
// its convergence condition: plans/0001-core.md; runs and their costs:
// plans/0011-run-compaction.md.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/mla_dims.h"
#include "kernels/status_macros.h"
#include "kvstore/kv_store.h"
#include "kvstore/sequence.h"

namespace verifyd {
namespace {

constexpr int64_t kNoSlot = std::numeric_limits<int64_t>::max();

// Length of the maximal run of consecutive slots that starts at position 0.
size_t FirstRunLength(const std::vector<int32_t>& slots) {
  size_t r = slots.empty() ? 0 : 1;
  while (r < slots.size() && slots[r] == slots[r - 1] + 1) ++r;
  return r;
}

// Destinations a plan has taken so far, as disjoint ranges: an overlay on the allocator's free
// set, so planning never copies the allocator. Pass 1 takes ranges in increasing order (a
// sequence only grows below the next sequence's first slot), kept in a vector; pass 2's few
// relocations go to a map.
class ReservedRanges {
 public:
  // begin must be >= the end of every range added so far by AddIncreasing.
  void AddIncreasing(int64_t begin, int64_t end) { increasing_.emplace_back(begin, end); }
  void Add(int64_t begin, int64_t end) { others_.emplace(begin, end); }
  // The first reserved range that ends after `slot` ([b, e) with b possibly <= slot), or
  // {kNoSlot, kNoSlot}.
  std::pair<int64_t, int64_t> NextRange(int64_t slot) const {
    std::pair<int64_t, int64_t> next{kNoSlot, kNoSlot};
    // Ends increase with begins (disjoint ranges): the first range whose end is > slot.
    auto v = std::upper_bound(increasing_.begin(), increasing_.end(), slot,
                              [](int64_t s, const auto& range) { return s < range.second; });
    if (v != increasing_.end()) next = *v;
    auto it = others_.upper_bound(slot);
    if (it != others_.begin() && std::prev(it)->second > slot) --it;
    if (it != others_.end() && it->first < next.first) next = {it->first, it->second};
    return next;
  }

 private:
  std::vector<std::pair<int64_t, int64_t>> increasing_;
  std::map<int64_t, int64_t> others_;  // begin -> end
};

// The end of the window of consecutive free slots that starts at `slot`; `slot` itself when it
// is not free. Pass 1 needs no reservation check: a sequence's targets lie between its first run
// and the next sequence's first slot, and earlier sequences' targets below its own first slot.
int64_t FreeEnd(const SlotAllocator& allocator, int64_t slot) {
  if (slot >= allocator.capacity()) return slot;
  const std::optional<SlotRun> extent = allocator.FreeExtentAt(static_cast<int32_t>(slot));
  return extent ? extent->end() : slot;
}

// The lowest n available slots in a row: free extents holding n, lowest first, each split by the
// reserved ranges inside it.
std::optional<int32_t> LowestRunAvoiding(const SlotAllocator& allocator,
                                         const ReservedRanges& reserved, int64_t n) {
  int64_t from = 0;
  while (std::optional<SlotRun> extent = allocator.FindRunFrom(n, from)) {
    int64_t begin = extent->begin;
    while (begin < extent->end()) {
      const auto [r_begin, r_end] = reserved.NextRange(begin);
      const int64_t stop = std::clamp<int64_t>(r_begin, begin, extent->end());
      if (stop - begin >= n) return static_cast<int32_t>(begin);
      if (stop >= extent->end()) break;
      begin = r_end;
    }
    from = extent->end();
  }
  return std::nullopt;
}

// Adds one slot move to the plan, extending the last run when the position, source and
// destination all continue it (so runs come out maximal).
void AddMove(CompactionPlan& plan, SequenceId sequence, int64_t position, int32_t src,
             int32_t dst) {
  if (!plan.runs.empty()) {
    CompactionRun& last = plan.runs.back();
    if (last.sequence == sequence && int64_t{last.position} + last.length == position &&
        last.src_begin + last.length == src && last.dst_begin + last.length == dst) {
      ++last.length;
      return;
    }
  }
  plan.runs.push_back({sequence, static_cast<int32_t>(position), src, dst, 1});
}

void ReserveRunsFrom(const CompactionPlan& plan, size_t first_run, ReservedRanges& reserved) {
  for (size_t k = first_run; k < plan.runs.size(); ++k) {
    reserved.AddIncreasing(plan.runs[k].dst_begin,
                           int64_t{plan.runs[k].dst_begin} + plan.runs[k].length);
  }
}

// Indices of `runs` ordered by the range start `begin_of` picks (sorted as packed (start, index)
// integers: several times faster than an indirect comparator); the first pair of neighbours whose
// ranges overlap, as (lower index, higher index), if any.
template <typename BeginOf>
std::optional<std::pair<size_t, size_t>> FirstOverlap(const std::vector<CompactionRun>& runs,
                                                      BeginOf begin_of,
                                                      std::vector<uint32_t>& order) {
  std::vector<uint64_t> keys(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) {
    keys[k] = uint64_t{static_cast<uint32_t>(begin_of(runs[k]))} << 32 | k;
  }
  std::sort(keys.begin(), keys.end());
  order.resize(runs.size());
  for (size_t i = 0; i < keys.size(); ++i) order[i] = static_cast<uint32_t>(keys[i]);
  for (size_t i = 1; i < order.size(); ++i) {
    const CompactionRun& prev = runs[order[i - 1]];
    if (int64_t{begin_of(prev)} + prev.length > begin_of(runs[order[i]])) {
      return std::pair<size_t, size_t>{std::min(order[i - 1], order[i]),
                                       std::max(order[i - 1], order[i])};
    }
  }
  return std::nullopt;
}

}  // namespace

StoreStats KvStore::Stats() const {
  StoreStats stats;
  stats.capacity_slots = allocator_.capacity();
  stats.free_slots = allocator_.free_slots();
  stats.used_slots = stats.capacity_slots - stats.free_slots;
  stats.largest_free_run = allocator_.largest_free_run();
  FragmentationStats& frag = stats.fragmentation;
  for (const auto& [id, sequence] : sequences_) {
    ++frag.sequences;
    if (sequence->pending) stats.pending_slots += sequence->pending->num_nodes();
    const std::vector<int32_t>& slots = sequence->slots;
    if (slots.empty()) continue;
    frag.tokens += static_cast<int64_t>(slots.size());
    frag.tokens_outside_first_run += static_cast<int64_t>(slots.size() - FirstRunLength(slots));
    int64_t runs = 1;
    for (size_t p = 1; p < slots.size(); ++p) runs += slots[p] != slots[p - 1] + 1;
    frag.runs += runs;
  }
  return stats;
}

CompactionPlan KvStore::PlanCompaction(int64_t budget_bytes) const {
  CompactionPlan plan;
  plan.bytes_per_slot = static_cast<int64_t>(options_.num_layers) * kKvRowBytes;
  int64_t moves_left = budget_bytes > 0 ? budget_bytes / plan.bytes_per_slot : 0;
  if (moves_left == 0) return plan;

  // Fragmented sequences, lowest first slot first, so the bottom of the pool settles first
  // (sorted by the first slot held next to the pointer: no pointer chase per comparison).
  std::vector<std::pair<int32_t, const Sequence*>> by_first_slot;
  for (const auto& [id, sequence] : sequences_) {
    if (FirstRunLength(sequence->slots) < sequence->slots.size()) {
      by_first_slot.emplace_back(sequence->slots[0], sequence.get());
    }
  }
  if (by_first_slot.empty()) return plan;
  std::sort(by_first_slot.begin(), by_first_slot.end());
  std::vector<const Sequence*> order(by_first_slot.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = by_first_slot[i].second;
  ReservedRanges reserved;
  // Pass 1, (1): grow each first run in place (position p belongs at slots[0] + p). It runs for
  // every sequence before any relocation, so a relocation begun by an earlier call finishes before
  // pass 2 could hand the free slots after it to somebody else.
  std::vector<const Sequence*> blocked;
  for (const Sequence* sequence : order) {
    const std::vector<int32_t>& slots = sequence->slots;
    const int64_t n = static_cast<int64_t>(slots.size());
    const size_t first_new_run = plan.runs.size();
    // Targets in [window_begin, window_end) are available; the window is looked up once per
    // stretch of free slots, not per slot.
    int64_t window_end = 0;
    for (int64_t p = static_cast<int64_t>(FirstRunLength(slots)); p < n && moves_left > 0; ++p) {
      const int64_t target = int64_t{slots[0]} + p;
      if (slots[p] == target) continue;  // already in place (so not free: outside any window)
      if (target >= window_end) {
        window_end = FreeEnd(allocator_, target);
        if (window_end <= target) break;
      }
      AddMove(plan, sequence->id, p, slots[p], static_cast<int32_t>(target));
      --moves_left;
    }
    if (plan.runs.size() == first_new_run) blocked.push_back(sequence);
    ReserveRunsFrom(plan, first_new_run, reserved);
  }
  // Pass 2, (2): relocate each blocked sequence to the lowest free run that holds all of it. When
  // the budget ends first, the moved head becomes the first run and later calls grow it (pass 1).
  for (const Sequence* sequence : blocked) {
    if (moves_left == 0) break;
    const std::vector<int32_t>& slots = sequence->slots;
    const int64_t n = static_cast<int64_t>(slots.size());
    std::optional<int32_t> begin = LowestRunAvoiding(allocator_, reserved, n);
    if (!begin) continue;
    const int64_t count = std::min(n, moves_left);
    for (int64_t p = 0; p < count; ++p) {
      AddMove(plan, sequence->id, p, slots[p], static_cast<int32_t>(*begin + p));
    }
    reserved.Add(*begin, *begin + count);
    moves_left -= count;
  }
  return plan;
}

absl::Status KvStore::ExecuteCompaction(const CompactionPlan& plan) {
  const std::vector<CompactionRun>& runs = plan.runs;
  if (runs.empty()) return absl::OkStatus();
  std::vector<Sequence*> owners(runs.size());
  std::vector<SlotRunCopy> copies(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) {
    const CompactionRun& run = runs[k];
    // Built only on an error: a chunk checks many runs on the executor's hot path.
    const auto field = [k] { return absl::StrCat("runs[", k, "]"); };
    if (run.length < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field(), ".length = ", run.length, " must be >= 1"));
    }
    // Runs come grouped by sequence: look the owner up again only when it changes.
    Sequence* sequence = k > 0 && runs[k - 1].sequence == run.sequence ? owners[k - 1] : nullptr;
    if (sequence == nullptr) {
      auto it = sequences_.find(run.sequence);
      if (it == sequences_.end()) {
        return absl::FailedPreconditionError(absl::StrCat(field(), ".sequence = ", run.sequence,
                                                          " is not a live sequence (stale plan)"));
      }
      sequence = it->second.get();
    }
    const int64_t held = static_cast<int64_t>(sequence->slots.size());
    if (run.position < 0 || int64_t{run.position} + run.length > held) {
      return absl::FailedPreconditionError(
          absl::StrCat(field(), ": positions [", run.position, ", ",
                       int64_t{run.position} + run.length, ") are not all held by sequence ",
                       run.sequence, ", which holds ", held, " (stale plan)"));
    }
    if (run.dst_begin < 0 || int64_t{run.dst_begin} + run.length > allocator_.capacity()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field(), ".dst_begin = ", run.dst_begin, " with length ", run.length,
                       " must lie in [0, ", allocator_.capacity(), ")"));
    }
    // The one per-slot check: a branch-free compare loop the compiler vectorizes.
    const int32_t* slots = sequence->slots.data() + run.position;
    int32_t mismatch = 0;
    for (int32_t i = 0; i < run.length; ++i) mismatch |= slots[i] ^ (run.src_begin + i);
    if (mismatch != 0) {
      int32_t i = 0;
      while (slots[i] == run.src_begin + i) ++i;
      return absl::FailedPreconditionError(absl::StrCat(
          field(), ".src_begin = ", run.src_begin, ": position ", run.position + i, " of sequence ",
          run.sequence, " is in slot ", slots[i], ", not ", run.src_begin + i, " (stale plan)"));
    }
    if (!allocator_.IsFreeRun({run.dst_begin, run.length})) {
      return absl::FailedPreconditionError(
          absl::StrCat(field(), ".dst_begin = ", run.dst_begin, ": slots [", run.dst_begin, ", ",
                       run.dst_begin + run.length, ") are not all free (stale plan)"));
    }
    owners[k] = sequence;
    copies[k] = {run.src_begin, run.dst_begin, run.length};
  }
  // Sources are held slots and destinations free ones, so a source never meets a destination;
  // left to check: no slot is a source twice (a position listed twice) or a destination twice.
  std::vector<uint32_t> by_src, by_dst;
  if (auto overlap = FirstOverlap(
          runs, [](const CompactionRun& r) { return r.src_begin; }, by_src)) {
    return absl::InvalidArgumentError(
        absl::StrCat("runs[", overlap->second, "].src_begin = ", runs[overlap->second].src_begin,
                     ": its slots overlap those of runs[", overlap->first, "]"));
  }
  if (auto overlap = FirstOverlap(
          runs, [](const CompactionRun& r) { return r.dst_begin; }, by_dst)) {
    return absl::InvalidArgumentError(
        absl::StrCat("runs[", overlap->second, "].dst_begin = ", runs[overlap->second].dst_begin,
                     ": its slots overlap those of runs[", overlap->first, "]"));
  }

  VERIFYD_RETURN_IF_ERROR(storage_->CopyRuns(copies));
  for (size_t k = 0; k < runs.size(); ++k) {
    int32_t* slots = owners[k]->slots.data() + runs[k].position;
    for (int32_t i = 0; i < runs[k].length; ++i) slots[i] = runs[k].dst_begin + i;
    if (k == 0 || owners[k] != owners[k - 1]) owners[k]->slot_generation = next_slot_generation_++;
  }
  // Destinations that touch (a relocation split by its sources) are reserved as one range.
  for (size_t i = 0; i < by_dst.size();) {
    const int32_t begin = runs[by_dst[i]].dst_begin;
    int64_t end = int64_t{begin} + runs[by_dst[i]].length;
    for (++i; i < by_dst.size() && runs[by_dst[i]].dst_begin == end; ++i) {
      end += runs[by_dst[i]].length;
    }
    VERIFYD_RETURN_IF_ERROR(allocator_.Reserve({begin, static_cast<int32_t>(end - begin)}));
  }
  std::vector<SlotRun> sources(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) sources[k] = {runs[k].src_begin, runs[k].length};
  return allocator_.FreeSlotRuns(sources);
}

}  // namespace verifyd
