// SlotCopyCheck: the contract of KvStorage::CopySlots and CopyRuns, checked once for every storage.
//
// A copy may run all its moves in parallel (the device copy does), which is only order-free when
// no destination is written twice and no source is also a destination. The slot form is O(n) with
// a stamp per slot reused across calls; the run form is O(runs log runs), independent of lengths.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace verifyd {

// Rows of slots [src_begin, src_begin + length) go to [dst_begin, dst_begin + length).
struct SlotRunCopy {
  int32_t src_begin = 0;
  int32_t dst_begin = 0;
  int32_t length = 0;
};

class SlotCopyCheck {
 public:
  explicit SlotCopyCheck(int64_t capacity) : capacity_(capacity) {}

  // Equal lengths, every slot in [0, capacity), dst without repeats, src and dst disjoint.
  // INVALID_ARGUMENT naming the offending entry otherwise.
  absl::Status Check(absl::Span<const int32_t> src, absl::Span<const int32_t> dst);
  // Every length >= 1, both ranges inside [0, capacity), destination ranges pairwise disjoint,
  // no source range meeting a destination range (sources may repeat). INVALID_ARGUMENT naming
  // runs[k] otherwise. Allocates O(runs) scratch; never touches the per-slot stamps.
  absl::Status CheckRuns(absl::Span<const SlotRunCopy> runs) const;

 private:
  int64_t capacity_;
  std::vector<uint32_t> stamp_;  // stamp_[slot] == generation_: slot is a destination of this call
  uint32_t generation_ = 0;
};

}  // namespace verifyd
