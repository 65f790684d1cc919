// SlotAllocator: free extents of the slot space, lowest first; a request gets one contiguous run
// where one exists. O(log n) per call in the number of free extents.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace verifyd {

struct SlotRun {
  int32_t begin = 0;
  int32_t length = 0;
};

class SlotAllocator {
 public:
  explicit SlotAllocator(int64_t capacity);

  // n slots: the lowest free run of length >= n if one exists, else the lowest free slots over
  // several runs. RESOURCE_EXHAUSTED (naming `field` and the free count) when fewer than n are free.
  absl::StatusOr<std::vector<SlotRun>> Allocate(int64_t n, const char* field = "tokens");
  // Like Allocate, but first tries to extend in place: a run starting exactly at `hint`.
  absl::StatusOr<std::vector<SlotRun>> AllocateAfter(int32_t hint, int64_t n,
                                                     const char* field = "tokens");
  // Frees slots (any order). Every slot must be allocated (checked; INTERNAL on a double free).
  absl::Status Free(absl::Span<const int32_t> slots);
  // Allocates exactly [begin, begin+length) if free (used by compaction).
  absl::Status Reserve(SlotRun run);

  int64_t capacity() const { return capacity_; }
  int64_t free_slots() const { return free_count_; }
  int64_t largest_free_run() const;
  // The lowest free run of length >= n, if any (no allocation).
  std::optional<SlotRun> FindRun(int64_t n) const;
  bool IsFree(int32_t slot) const;

 private:
  int64_t capacity_;
  int64_t free_count_;
  std::map<int32_t, int32_t> extents_;                 // begin -> length
  std::set<std::pair<int32_t, int32_t>> by_length_;    // (length, begin)
};

}  // namespace verifyd
