// SlotAllocator: free extents of the slot space, lowest first; a request gets one contiguous run
// where one exists.
//
// Two structures describe the same free set:
//   extents_   begin -> length of every maximal free extent (ordered: neighbours for merging, and
//   the
//              lowest-slots walk when no single extent is long enough);
//   max_tree_  a max segment tree over slot addresses whose leaf `b` holds the length of the free
//              extent beginning at b (0 elsewhere). Descending it towards the left child whenever
//              that child's max is >= n finds the LOWEST extent that holds n slots in O(log
//              capacity); a length-ordered set would find the shortest one instead, which is not
//              lowest-first.
// Every call is O(log capacity) plus O(log E) map work per extent touched (E = free extents).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace verifyd {

struct SlotRun {
  int32_t begin = 0;
  int32_t length = 0;
  int32_t end() const { return begin + length; }
};

class SlotAllocator {
 public:
  explicit SlotAllocator(int64_t capacity);

  // n slots: the lowest free run of length >= n if one exists, else the lowest free slots over
  // several runs. RESOURCE_EXHAUSTED (naming `field` and the free count) when fewer than n are
  // free.
  absl::StatusOr<std::vector<SlotRun>> Allocate(int64_t n, const char* field = "tokens");
  // Like Allocate, but first tries to extend in place: when the free extent starting exactly at
  // `hint` holds n slots, returns [hint, hint+n).
  absl::StatusOr<std::vector<SlotRun>> AllocateAfter(int32_t hint, int64_t n,
                                                     const char* field = "tokens");
  // Frees slots (any order). Every slot must be allocated (checked before anything changes;
  // INTERNAL on a double free, INVALID_ARGUMENT out of range).
  absl::Status Free(absl::Span<const int32_t> slots);
  // Frees runs (any order): the run-granular Free that compaction uses, O(runs log runs) instead
  // of a sort per slot. Same checks (every slot allocated, in range, no run listed twice) before
  // anything changes.
  absl::Status FreeSlotRuns(absl::Span<const SlotRun> runs);
  // Allocates exactly [begin, begin+length) if free (used by compaction).
  absl::Status Reserve(SlotRun run);

  int64_t capacity() const { return capacity_; }
  int64_t free_slots() const { return free_count_; }
  int64_t largest_free_run() const;
  // The lowest free extent of length >= n, if any (no allocation).
  std::optional<SlotRun> FindRun(int64_t n) const { return FindRunFrom(n, 0); }
  // The lowest free extent of length >= n that begins at or after `from`. O(log capacity).
  std::optional<SlotRun> FindRunFrom(int64_t n, int64_t from) const;
  bool IsFree(int32_t slot) const;
  // True when every slot of the run is free (a non-empty run inside [0, capacity)). O(log E).
  bool IsFreeRun(SlotRun run) const;
  // The maximal free extent that contains `slot`, if it is free. O(log E).
  std::optional<SlotRun> FreeExtentAt(int32_t slot) const;
  // The free extents in address order (for statistics and tests).
  std::vector<SlotRun> FreeRuns() const;

 private:
  void InsertExtent(int32_t begin, int32_t length);
  void EraseExtent(std::map<int32_t, int32_t>::iterator it);
  void SetLeaf(int32_t begin, int32_t length);
  // Frees sorted, disjoint, in-range runs that were checked to be allocated.
  void FreeCheckedRuns(absl::Span<const SlotRun> sorted_runs);
  // Takes [begin, begin+n) out of the extent that starts at `begin`.
  void TakeFront(std::map<int32_t, int32_t>::iterator it, int32_t n);
  // Leftmost leaf >= from with value >= n under `node` (covering [lo, hi)); -1 if none.
  int64_t Leftmost(int64_t node, int64_t lo, int64_t hi, int64_t from, int64_t n) const;

  int64_t capacity_;
  int64_t free_count_;
  std::map<int32_t, int32_t> extents_;  // begin -> length
  int64_t leaves_ = 1;                  // power of two >= capacity
  std::vector<int32_t> max_tree_;       // [2 * leaves_], node 1 is the root
};

}  // namespace verifyd
