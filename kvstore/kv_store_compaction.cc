// KvStore: fragmentation statistics and compaction (plan + execute), run-granular. Strategy and
// its convergence condition: plans/0001-core.md; runs and their costs:
// plans/0011-run-compaction.md.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvstore/kv_store.h"
#include "kvstore/sequence.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr int64_t kNoSlot = std::numeric_limits<int64_t>::max();

// Destinations a plan has taken so far, as disjoint ranges: an overlay on the allocator's free
// set, so planning never copies the allocator. Pass 1 takes ranges in increasing order (a
// sequence only grows below the next sequence's first slot), kept in a vector; pass 2's few
// relocations go to a map.
class ReservedRanges {
 public:
  // Touching ranges are merged: relocations pack upwards from the bottom of one free extent, and
  // LowestRunAvoiding then steps over all of them at once instead of one per earlier relocation
  // (which made a plan of many relocations quadratic in their number).
  // begin must be >= the end of every range added so far by AddIncreasing.
  void AddIncreasing(int64_t begin, int64_t end) {
    if (!increasing_.empty() && increasing_.back().second == begin) {
      increasing_.back().second = end;
    } else {
      increasing_.emplace_back(begin, end);
    }
  }
  void Add(int64_t begin, int64_t end) {
    auto next = others_.lower_bound(begin);
    if (next != others_.end() && next->first == end) {
      end = next->second;
      next = others_.erase(next);
    }
    if (next != others_.begin() && std::prev(next)->second == begin) {
      std::prev(next)->second = end;
      return;
    }
    others_.emplace_hint(next, begin, end);
  }
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

// Adds a run of `length` slot moves to the plan, extending the last run when the position, source
// and destination all continue it (so runs come out maximal).
void AddRun(CompactionPlan& plan, SequenceId sequence, int64_t position, int32_t src, int64_t dst,
            int64_t length) {
  if (!plan.runs.empty()) {
    CompactionRun& last = plan.runs.back();
    if (last.sequence == sequence && int64_t{last.position} + last.length == position &&
        last.src_begin + last.length == src && int64_t{last.dst_begin} + last.length == dst) {
      last.length += static_cast<int32_t>(length);
      return;
    }
  }
  plan.runs.push_back({sequence, static_cast<int32_t>(position), src, static_cast<int32_t>(dst),
                       static_cast<int32_t>(length)});
}

// How many slots from position p on hold consecutive slots (at most limit >= 1): a tight compare
// loop, so a plan costs per run plus well under a nanosecond per slot.
int64_t ConsecutiveFrom(const std::vector<int32_t>& slots, int64_t p, int64_t limit) {
  int64_t length = 1;
  while (length < limit && slots[p + length] == slots[p] + length) ++length;
  return length;
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

// The boundaries (kvstore/fragmentation_tracker.h) that rewriting the positions of `runs` can
// change, as sorted, distinct keys (owner ordinal << 32 | position in the owner's accounted list,
// Sequence::accounted()): each run's first position
// and the one after its last; inside a run consecutive sources go to consecutive destinations, so
// those boundaries keep their state. owner_by_ordinal[o] is ordinal o's owner. Plans list each
// owner's runs together in position order, so ordinals are simply the groups of equal owners and
// the keys come sorted: O(runs). first_sight(owner), called once per group, says whether the
// owner starts its first group; when one has two, a group takes its owner's first ordinal and the
// keys are sorted. (A template only to name the store's private Sequence type by deduction.)
template <typename Owner, typename FirstSight>
std::vector<uint64_t> ChangeableBoundaries(const std::vector<CompactionRun>& runs,
                                           const std::vector<Owner*>& owners,
                                           FirstSight first_sight,
                                           std::vector<Owner*>& owner_by_ordinal) {
  std::vector<uint64_t> keys;
  keys.reserve(2 * runs.size());
  bool owner_repeats = false;
  for (size_t k = 0; k < runs.size(); ++k) {
    if (k == 0 || owners[k] != owners[k - 1]) {
      owner_by_ordinal.push_back(owners[k]);
      owner_repeats |= !first_sight(owners[k]);
    }
    const uint64_t ordinal = owner_by_ordinal.size() - 1;
    const int64_t base = owners[k]->accounted_begin();
    const int64_t held = static_cast<int64_t>(owners[k]->slots.size()) - base;
    const int64_t begin = runs[k].position - base;
    const int64_t end = begin + runs[k].length;
    if (begin >= 1) keys.push_back(ordinal << 32 | static_cast<uint64_t>(begin));
    if (end < held) keys.push_back(ordinal << 32 | static_cast<uint64_t>(end));
  }
  if (owner_repeats) {
    absl::flat_hash_map<const Owner*, uint64_t> first_ordinal;
    for (size_t o = 0; o < owner_by_ordinal.size(); ++o) {
      first_ordinal.emplace(owner_by_ordinal[o], o);
    }
    for (uint64_t& key : keys) {
      key = first_ordinal[owner_by_ordinal[key >> 32]] << 32 | (key & 0xffffffffu);
    }
  }
  if (!std::is_sorted(keys.begin(), keys.end())) std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

}  // namespace

StoreStats KvStore::Stats() const {
  StoreStats stats;
  stats.kv_dtype = storage_->dtype();
  stats.row_bytes = storage_->row_bytes();
  stats.capacity_slots = allocator_.capacity();
  stats.pool_bytes = stats.capacity_slots * options_.num_layers * stats.row_bytes;
  stats.free_slots = allocator_.free_slots();
  stats.used_slots = stats.capacity_slots - stats.free_slots;
  stats.largest_free_run = allocator_.largest_free_run();
  stats.pending_slots = pending_slots_;
  stats.fragmentation = fragmentation_.totals();
  stats.shared_slots = shared_slots_;
  stats.sequences = static_cast<int64_t>(sequences_.size());
  stats.slot_table_entries = table_entries_;
  stats.shared_references = shared_references_;
  return stats;
}

CompactionPlan KvStore::PlanCompaction(int64_t budget_bytes) const {
  CompactionPlan plan;
  plan.bytes_per_slot = static_cast<int64_t>(options_.num_layers) * storage_->row_bytes();
  int64_t moves_left = budget_bytes > 0 ? budget_bytes / plan.bytes_per_slot : 0;
  if (moves_left == 0) return plan;

  // Fragmented sequences, lowest first slot first, so the bottom of the pool settles first
  // (sorted by the first slot held next to the pointer: no pointer chase per comparison). The
  // tracker names them with their first runs: no walk of any slot list.
  struct Fragmented {
    int32_t first_slot;
    const Sequence* sequence;
    int64_t first_run;
  };
  std::vector<Fragmented> order;
  // A sequence's list here is the part it accounts (Sequence::accounted()): a fork's shared prefix
  // is its ancestors' to place, and moves with them.
  fragmentation_.ForEachFragmented([&](SequenceId id, int64_t first_run) {
    const Sequence* sequence = sequences_.find(id)->second.get();
    const int64_t base = sequence->accounted_begin();
    order.push_back({sequence->slots[base], sequence, base + first_run});
  });
  if (order.empty()) return plan;
  std::sort(order.begin(), order.end(),
            [](const Fragmented& a, const Fragmented& b) { return a.first_slot < b.first_slot; });
  ReservedRanges reserved;
  // Pass 1, (1): grow each first run in place (position p belongs at slots[base] + p - base, base
  // the first accounted position; plain sequences: base 0). It runs for
  // every sequence before any relocation, so a relocation begun by an earlier call finishes before
  // pass 2 could hand the free slots after it to somebody else.
  std::vector<const Sequence*> blocked;
  for (const auto& [first_slot, sequence, first_run] : order) {
    const std::vector<int32_t>& slots = sequence->slots;
    const int64_t n = static_cast<int64_t>(slots.size());
    const int64_t base = sequence->accounted_begin();
    const size_t first_new_run = plan.runs.size();
    // Targets in [window_begin, window_end) are available; the window is looked up once per
    // stretch of free slots, not per slot.
    int64_t window_end = 0;
    for (int64_t p = first_run; p < n && moves_left > 0;) {
      const int64_t target = int64_t{slots[base]} + p - base;
      if (slots[p] == target) {  // already in place (so not free: outside any window)
        ++p;
        continue;
      }
      if (target >= window_end) {
        window_end = FreeEnd(allocator_, target);
        if (window_end <= target) break;
      }
      // A stretch of consecutive sources moves as one run, within the window and the budget
      // (none of it is in place: its sources continue slots[p], which is not).
      const int64_t length =
          ConsecutiveFrom(slots, p, std::min({n - p, window_end - target, moves_left}));
      AddRun(plan, sequence->id, p, slots[p], target, length);
      p += length;
      moves_left -= length;
    }
    if (plan.runs.size() == first_new_run) blocked.push_back(sequence);
    ReserveRunsFrom(plan, first_new_run, reserved);
  }
  // Pass 2, (2): relocate each blocked sequence to the lowest free run that holds all of it. When
  // the budget ends first, the moved head becomes the first run and later calls grow it (pass 1).
  for (const Sequence* sequence : blocked) {
    if (moves_left == 0) break;
    const std::vector<int32_t>& slots = sequence->slots;
    const int64_t base = sequence->accounted_begin();
    const int64_t n = static_cast<int64_t>(slots.size()) - base;  // accounted positions
    std::optional<int32_t> begin = LowestRunAvoiding(allocator_, reserved, n);
    if (!begin) continue;
    const int64_t count = std::min(n, moves_left);
    for (int64_t p = 0; p < count;) {
      const int64_t length = ConsecutiveFrom(slots, base + p, count - p);
      AddRun(plan, sequence->id, base + p, slots[base + p], int64_t{*begin} + p, length);
      p += length;
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
    // A shared position moves with the holder that accounts it (which rewrites the others).
    if (run.position < sequence->accounted_begin()) {
      return absl::FailedPreconditionError(
          absl::StrCat(field(), ".position = ", run.position, ": sequence ", run.sequence,
                       " shares positions below ", sequence->accounted_begin(),
                       " with an older holder, which moves them (stale plan)"));
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
  // The fragmentation figures follow the rewrite: the state of every boundary it can change,
  // before and after.
  std::vector<Sequence*> owner_by_ordinal;
  std::vector<FragmentationTracker::Handle> handles;  // by ordinal
  const uint64_t batch = fragmentation_.BeginBatch();
  const std::vector<uint64_t> boundaries = ChangeableBoundaries(
      runs, owners,
      [&](const Sequence* owner) {
        handles.push_back(fragmentation_.Find(owner->id));
        return FragmentationTracker::MarkInBatch(handles.back(), batch);
      },
      owner_by_ordinal);
  std::vector<FragmentationTracker::BoundaryChange> changes(boundaries.size());
  for (size_t i = 0; i < boundaries.size(); ++i) {
    const int64_t position = static_cast<uint32_t>(boundaries[i]);
    changes[i].position = position;
    changes[i].was_break =
        FragmentationTracker::IsBreak(owner_by_ordinal[boundaries[i] >> 32]->accounted(), position);
  }
  for (size_t k = 0; k < runs.size(); ++k) {
    int32_t* slots = owners[k]->slots.data() + runs[k].position;
    for (int32_t i = 0; i < runs[k].length; ++i) slots[i] = runs[k].dst_begin + i;
    if (k == 0 || owners[k] != owners[k - 1]) owners[k]->slot_generation = next_slot_generation_++;
    // A shared run moves once: every list holding it is rewritten in this same step.
    if (!owners[k]->children.empty()) {
      RewriteDescendants(*owners[k], runs[k].position, runs[k].dst_begin, runs[k].length,
                         runs[k].position + runs[k].length);
    }
    for (int32_t i = 0; i < runs[k].length; ++i) {
      holders_[static_cast<size_t>(runs[k].dst_begin + i)] =
          std::exchange(holders_[static_cast<size_t>(runs[k].src_begin + i)], 0);
    }
  }
  for (size_t i = 0; i < boundaries.size();) {
    const Sequence& owner = *owner_by_ordinal[boundaries[i] >> 32];
    const FragmentationTracker::Handle handle = handles[boundaries[i] >> 32];
    size_t end = i;
    for (; end < boundaries.size() && boundaries[end] >> 32 == boundaries[i] >> 32; ++end) {
      changes[end].is_break =
          FragmentationTracker::IsBreak(owner.accounted(), changes[end].position);
    }
    fragmentation_.Rewrite(handle, owner.accounted(),
                           absl::MakeConstSpan(changes).subspan(i, end - i));
    i = end;
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
