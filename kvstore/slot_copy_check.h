// SlotCopyCheck: the contract of KvStorage::CopySlots, checked once for every storage.
//
// A copy may run all its moves in parallel (the device copy does), which is only order-free when
// dst has no repeats and no source is also a destination. The check is O(n) with a stamp per slot
// reused across calls (a compaction chunk checks thousands of moves on the executor's hot path).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace verifyd {

class SlotCopyCheck {
 public:
  explicit SlotCopyCheck(int64_t capacity) : capacity_(capacity) {}

  // Equal lengths, every slot in [0, capacity), dst without repeats, src and dst disjoint.
  // INVALID_ARGUMENT naming the offending entry otherwise.
  absl::Status Check(absl::Span<const int32_t> src, absl::Span<const int32_t> dst);

 private:
  int64_t capacity_;
  std::vector<uint32_t> stamp_;  // stamp_[slot] == generation_: slot is a destination of this call
  uint32_t generation_ = 0;
};

}  // namespace verifyd
