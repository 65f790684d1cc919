// KvStore: fragmentation statistics and compaction (plan + execute). Strategy and its convergence
// condition: plans/0001-core.md.
#include <algorithm>
#include <optional>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kernels/mla_dims.h"
#include "kernels/status_macros.h"
#include "kvstore/kv_store.h"
#include "kvstore/sequence.h"

namespace verifyd {
namespace {

// Length of the maximal run of consecutive slots that starts at position 0.
size_t FirstRunLength(const std::vector<int32_t>& slots) {
  size_t r = slots.empty() ? 0 : 1;
  while (r < slots.size() && slots[r] == slots[r - 1] + 1) ++r;
  return r;
}

// The lowest n free slots in a row that avoid `reserved`: free extents holding n, lowest first,
// each split by the reserved slots inside it.
std::optional<int32_t> LowestRunAvoiding(const SlotAllocator& allocator,
                                         const std::set<int32_t>& reserved, int64_t n) {
  int64_t from = 0;
  while (std::optional<SlotRun> extent = allocator.FindRunFrom(n, from)) {
    int64_t begin = extent->begin;
    for (auto it = reserved.lower_bound(extent->begin);; ++it) {
      const int64_t stop = it == reserved.end() || *it >= extent->end() ? extent->end() : *it;
      if (stop - begin >= n) return static_cast<int32_t>(begin);
      if (stop == extent->end()) break;
      begin = *it + 1;
    }
    from = extent->end();
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
  plan.bytes_per_move = static_cast<int64_t>(options_.num_layers) * kKvRowBytes;
  int64_t moves_left = budget_bytes > 0 ? budget_bytes / plan.bytes_per_move : 0;
  if (moves_left == 0) return plan;

  // Fragmented sequences, lowest first slot first, so the bottom of the pool settles first.
  std::vector<const Sequence*> order;
  for (const auto& [id, sequence] : sequences_) {
    if (FirstRunLength(sequence->slots) < sequence->slots.size()) order.push_back(sequence.get());
  }
  if (order.empty()) return plan;
  std::sort(order.begin(), order.end(),
            [](const Sequence* a, const Sequence* b) { return a->slots[0] < b->slots[0]; });
  // Destinations chosen so far; a slot is available when the allocator has it free and it is not
  // in here (an overlay instead of a copy of the allocator: planning stays O(moves), not O(C)).
  std::set<int32_t> reserved;
  auto available = [&](int64_t slot) {
    return slot < allocator_.capacity() && allocator_.IsFree(static_cast<int32_t>(slot)) &&
           !reserved.contains(static_cast<int32_t>(slot));
  };
  // Pass 1, (1): grow each first run in place (position p belongs at slots[0] + p). It runs for
  // every sequence before any relocation, so a relocation begun by an earlier call finishes before
  // pass 2 could hand the free slots after it to somebody else.
  std::vector<const Sequence*> blocked;
  for (const Sequence* sequence : order) {
    const std::vector<int32_t>& slots = sequence->slots;
    const int64_t n = static_cast<int64_t>(slots.size());
    bool moved = false;
    for (int64_t p = static_cast<int64_t>(FirstRunLength(slots)); p < n && moves_left > 0; ++p) {
      const int64_t target = int64_t{slots[0]} + p;
      if (slots[p] == target) continue;
      if (!available(target)) break;
      reserved.insert(static_cast<int32_t>(target));
      plan.moves.push_back(
          {sequence->id, static_cast<int32_t>(p), slots[p], static_cast<int32_t>(target)});
      --moves_left;
      moved = true;
    }
    if (!moved) blocked.push_back(sequence);
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
      const auto dst = static_cast<int32_t>(*begin + p);
      reserved.insert(dst);
      plan.moves.push_back({sequence->id, static_cast<int32_t>(p), slots[p], dst});
    }
    moves_left -= count;
  }
  return plan;
}

absl::Status KvStore::ExecuteCompaction(const CompactionPlan& plan) {
  std::vector<int32_t> src;
  std::vector<int32_t> dst;
  src.reserve(plan.moves.size());
  dst.reserve(plan.moves.size());
  absl::flat_hash_set<int32_t> seen_src;
  absl::flat_hash_set<int32_t> seen_dst;
  seen_src.reserve(plan.moves.size());
  seen_dst.reserve(plan.moves.size());
  std::vector<Sequence*> owners;
  owners.reserve(plan.moves.size());
  for (size_t k = 0; k < plan.moves.size(); ++k) {
    const SlotMove& move = plan.moves[k];
    // Built only on an error: a chunk checks thousands of moves on the executor's hot path.
    const auto field = [k] { return absl::StrCat("moves[", k, "]"); };
    // Moves come grouped by sequence: look the owner up again only when it changes.
    Sequence* sequence =
        owners.empty() || plan.moves[k - 1].sequence != move.sequence ? nullptr : owners.back();
    if (sequence == nullptr) {
      auto it = sequences_.find(move.sequence);
      if (it == sequences_.end()) {
        return absl::FailedPreconditionError(absl::StrCat(field(), ".sequence = ", move.sequence,
                                                          " is not a live sequence (stale plan)"));
      }
      sequence = it->second.get();
    }
    if (move.position < 0 || move.position >= static_cast<int64_t>(sequence->slots.size()) ||
        sequence->slots[move.position] != move.src) {
      return absl::FailedPreconditionError(
          absl::StrCat(field(), ": src = ", move.src, " is not position ", move.position,
                       " of sequence ", move.sequence, " (stale plan)"));
    }
    if (move.dst < 0 || move.dst >= allocator_.capacity()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field(), ".dst = ", move.dst, " must be in [0, ", allocator_.capacity(), ")"));
    }
    if (!seen_src.insert(move.src).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field(), ".src = ", move.src, " repeats an earlier move's src"));
    }
    if (!seen_dst.insert(move.dst).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field(), ".dst = ", move.dst, " repeats an earlier move's dst"));
    }
    if (!allocator_.IsFree(move.dst)) {
      return absl::FailedPreconditionError(
          absl::StrCat(field(), ".dst = ", move.dst, " is not free (stale plan)"));
    }
    owners.push_back(sequence);
    src.push_back(move.src);
    dst.push_back(move.dst);
  }
  if (plan.moves.empty()) return absl::OkStatus();

  VERIFYD_RETURN_IF_ERROR(storage_->CopySlots(src, dst));
  for (size_t k = 0; k < plan.moves.size(); ++k) {
    owners[k]->slots[plan.moves[k].position] = plan.moves[k].dst;
    if (k == 0 || owners[k] != owners[k - 1]) owners[k]->slot_generation = next_slot_generation_++;
  }
  std::vector<int32_t> sorted_dst = dst;
  std::sort(sorted_dst.begin(), sorted_dst.end());
  for (size_t k = 0; k < sorted_dst.size();) {
    size_t e = k + 1;
    while (e < sorted_dst.size() && sorted_dst[e] == sorted_dst[e - 1] + 1) ++e;
    VERIFYD_RETURN_IF_ERROR(allocator_.Reserve({sorted_dst[k], static_cast<int32_t>(e - k)}));
    k = e;
  }
  return allocator_.Free(src);
}

}  // namespace verifyd
