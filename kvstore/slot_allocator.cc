#include "kvstore/slot_allocator.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace verifyd {

SlotAllocator::SlotAllocator(int64_t capacity)
    : capacity_(std::clamp<int64_t>(capacity, 0, std::numeric_limits<int32_t>::max())),
      free_count_(capacity_) {
  while (leaves_ < capacity_) leaves_ *= 2;
  max_tree_.assign(2 * leaves_, 0);
  if (capacity_ > 0) InsertExtent(0, static_cast<int32_t>(capacity_));
}

void SlotAllocator::SetLeaf(int32_t begin, int32_t length) {
  int64_t node = leaves_ + begin;
  max_tree_[node] = length;
  // An ancestor depends only on its children: once one keeps its value, every higher one does.
  for (node /= 2; node >= 1; node /= 2) {
    const int32_t value = std::max(max_tree_[2 * node], max_tree_[2 * node + 1]);
    if (max_tree_[node] == value) break;
    max_tree_[node] = value;
  }
}

void SlotAllocator::InsertExtent(int32_t begin, int32_t length) {
  extents_[begin] = length;
  SetLeaf(begin, length);
}

void SlotAllocator::EraseExtent(std::map<int32_t, int32_t>::iterator it) {
  SetLeaf(it->first, 0);
  extents_.erase(it);
}

void SlotAllocator::TakeFront(std::map<int32_t, int32_t>::iterator it, int32_t n) {
  const int32_t begin = it->first;
  const int32_t length = it->second;
  free_count_ -= n;
  if (length == n) {
    EraseExtent(it);
    return;
  }
  // The rest of the extent keeps the map node (re-keyed, no allocation): compaction reserves a
  // range per run on the executor's hot path.
  SetLeaf(begin, 0);
  auto node = extents_.extract(it);
  node.key() = begin + n;
  node.mapped() = length - n;
  extents_.insert(std::move(node));
  SetLeaf(begin + n, length - n);
}

int64_t SlotAllocator::largest_free_run() const { return max_tree_[1]; }

int64_t SlotAllocator::Leftmost(int64_t node, int64_t lo, int64_t hi, int64_t from,
                                int64_t n) const {
  if (hi <= from || max_tree_[node] < n) return -1;
  if (node >= leaves_) return lo;
  // Only nodes straddling `from` recurse on both sides, so this visits O(log capacity) nodes.
  const int64_t mid = (lo + hi) / 2;
  const int64_t left = Leftmost(2 * node, lo, mid, from, n);
  return left >= 0 ? left : Leftmost(2 * node + 1, mid, hi, from, n);
}

std::optional<SlotRun> SlotAllocator::FindRunFrom(int64_t n, int64_t from) const {
  if (n <= 0 || max_tree_[1] < n) return std::nullopt;
  const int64_t leaf = Leftmost(1, 0, leaves_, std::max<int64_t>(from, 0), n);
  if (leaf < 0) return std::nullopt;
  return SlotRun{static_cast<int32_t>(leaf), max_tree_[leaves_ + leaf]};
}

absl::StatusOr<std::vector<SlotRun>> SlotAllocator::Allocate(int64_t n, const char* field) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(field, " = ", n, " must be >= 0"));
  if (n > free_count_) {
    return absl::ResourceExhaustedError(absl::StrCat(field, ": need ", n, " free KV slots, only ",
                                                     free_count_, " of ", capacity_, " are free"));
  }
  std::vector<SlotRun> runs;
  if (n == 0) return runs;
  if (std::optional<SlotRun> run = FindRun(n)) {
    TakeFront(extents_.find(run->begin), static_cast<int32_t>(n));
    runs.push_back({run->begin, static_cast<int32_t>(n)});
    return runs;
  }
  // No extent holds n: the lowest free slots, whole extents from the bottom up.
  int64_t remaining = n;
  while (remaining > 0) {
    auto it = extents_.begin();
    const int32_t take = static_cast<int32_t>(std::min<int64_t>(remaining, it->second));
    runs.push_back({it->first, take});
    TakeFront(it, take);
    remaining -= take;
  }
  return runs;
}

absl::StatusOr<std::vector<SlotRun>> SlotAllocator::AllocateAfter(int32_t hint, int64_t n,
                                                                  const char* field) {
  if (n > 0 && n <= free_count_) {
    auto it = extents_.find(hint);
    if (it != extents_.end() && it->second >= n) {
      TakeFront(it, static_cast<int32_t>(n));
      return std::vector<SlotRun>{{hint, static_cast<int32_t>(n)}};
    }
  }
  return Allocate(n, field);
}

bool SlotAllocator::IsFree(int32_t slot) const {
  auto it = extents_.upper_bound(slot);
  if (it == extents_.begin()) return false;
  --it;
  return slot < it->first + it->second;
}

bool SlotAllocator::IsFreeRun(SlotRun run) const {
  if (run.length <= 0 || run.begin < 0 || int64_t{run.begin} + run.length > capacity_) return false;
  const std::optional<SlotRun> extent = FreeExtentAt(run.begin);
  return extent && extent->end() >= run.end();
}

std::optional<SlotRun> SlotAllocator::FreeExtentAt(int32_t slot) const {
  auto it = extents_.upper_bound(slot);
  if (it == extents_.begin()) return std::nullopt;
  --it;
  if (slot >= it->first + it->second) return std::nullopt;
  return SlotRun{it->first, it->second};
}

absl::Status SlotAllocator::Free(absl::Span<const int32_t> slots) {
  std::vector<int32_t> sorted(slots.begin(), slots.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t k = 0; k < sorted.size(); ++k) {
    if (sorted[k] < 0 || sorted[k] >= capacity_) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", sorted[k], " must be in [0, ", capacity_, ")"));
    }
    if (k > 0 && sorted[k] == sorted[k - 1]) {
      return absl::InternalError(absl::StrCat("double free: slot ", sorted[k], " listed twice"));
    }
  }
  // Maximal runs of the request.
  std::vector<SlotRun> runs;
  for (int32_t slot : sorted) {
    if (!runs.empty() && runs.back().end() == slot) {
      ++runs.back().length;
    } else {
      runs.push_back({slot, 1});
    }
  }
  return FreeSlotRuns(runs);
}

absl::Status SlotAllocator::FreeSlotRuns(absl::Span<const SlotRun> runs) {
  for (const SlotRun& run : runs) {
    if (run.length <= 0 || run.begin < 0 || int64_t{run.begin} + run.length > capacity_) {
      return absl::InvalidArgumentError(absl::StrCat("run [", run.begin, ", +", run.length,
                                                     ") must be non-empty and within [0, ",
                                                     capacity_, ")"));
    }
  }
  // Sorted as packed (begin, length) integers: several times faster than a comparator on structs.
  std::vector<uint64_t> keys(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) {
    keys[k] = uint64_t{static_cast<uint32_t>(runs[k].begin)} << 32 |
              static_cast<uint32_t>(runs[k].length);
  }
  std::sort(keys.begin(), keys.end());
  // Touching runs are merged first (compaction frees the slots of neighbouring sequences
  // together): every map lookup below is a cache-missing tree walk, one per merged run.
  std::vector<SlotRun> sorted;
  sorted.reserve(runs.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    const SlotRun run{static_cast<int32_t>(keys[k] >> 32),
                      static_cast<int32_t>(keys[k] & 0xffffffffu)};
    if (!sorted.empty() && sorted.back().end() > run.begin) {
      return absl::InternalError(absl::StrCat("double free: slot ", run.begin, " listed twice"));
    }
    if (!sorted.empty() && sorted.back().end() == run.begin) {
      sorted.back().length += run.length;
    } else {
      sorted.push_back(run);
    }
  }
  for (const SlotRun& run : sorted) {
    // Each run must not overlap any free extent.
    auto it = extents_.lower_bound(run.end());
    if (it != extents_.begin()) {
      --it;
      if (it->first + it->second > run.begin) {
        return absl::InternalError(
            absl::StrCat("double free: slot ", std::max(run.begin, it->first), " is already free"));
      }
    }
  }
  FreeCheckedRuns(sorted);
  return absl::OkStatus();
}

void SlotAllocator::FreeCheckedRuns(absl::Span<const SlotRun> sorted_runs) {
  for (const SlotRun& run : sorted_runs) {
    free_count_ += run.length;
    int32_t length = run.length;
    auto next = extents_.lower_bound(run.end());
    if (next != extents_.end() && next->first == run.end()) {
      length += next->second;
      SetLeaf(next->first, 0);
      next = extents_.erase(next);
    }
    if (next != extents_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == run.begin) {  // grows in place: no map node changes
        prev->second += length;
        SetLeaf(prev->first, prev->second);
        continue;
      }
    }
    extents_.emplace_hint(next, run.begin, length);
    SetLeaf(run.begin, length);
  }
}

absl::Status SlotAllocator::Reserve(SlotRun run) {
  if (run.length <= 0 || run.begin < 0 || int64_t{run.begin} + run.length > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("run [", run.begin, ", +", run.length,
                                                   ") must be non-empty and within [0, ", capacity_,
                                                   ")"));
  }
  auto it = extents_.upper_bound(run.begin);
  if (it == extents_.begin() || (--it, it->first + it->second < run.end())) {
    return absl::FailedPreconditionError(
        absl::StrCat("run [", run.begin, ", ", run.end(), ") is not entirely free"));
  }
  const int32_t begin = it->first;
  const int32_t length = it->second;
  if (run.begin == begin) {
    TakeFront(it, run.length);
    return absl::OkStatus();
  }
  // The part before the run keeps the extent's node.
  it->second = run.begin - begin;
  SetLeaf(begin, it->second);
  if (begin + length > run.end()) {
    extents_.emplace_hint(std::next(it), run.end(), begin + length - run.end());
    SetLeaf(run.end(), begin + length - run.end());
  }
  free_count_ -= run.length;
  return absl::OkStatus();
}

std::vector<SlotRun> SlotAllocator::FreeRuns() const {
  std::vector<SlotRun> runs;
  runs.reserve(extents_.size());
  for (const auto& [begin, length] : extents_) runs.push_back({begin, length});
  return runs;
}

}  // namespace verifyd
