// The split plans of recent batch shapes. Every layer of one decode step verifies the same shapes,
// so the planner runs once per step, not once per layer.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/split_planner.h"

namespace verifyd {

struct CachedPlan {
  uint64_t id = 0;  // unique per planned shape (graphs key on item counts, not on this)
  int num_heads = 0;
  int reserved_sms = 0;
  std::vector<int32_t> prefix_len, q_len;
  SplitPlan plan;
  WorkspaceLayout layout;
  std::vector<uint8_t> packed;  // PackPlan(plan, layout)
};

class SplitPlanCache {
 public:
  // capacity: shapes remembered (least recently used goes first).
  SplitPlanCache(int num_sms, int capacity) : num_sms_(num_sms), capacity_(capacity) {}

  // The plan for these shapes, planned now if not remembered, on the device's SMs less
  // `reserved_sms` (at least one). The reference stays valid until the next Get.
  absl::StatusOr<const CachedPlan*> Get(absl::Span<const int32_t> prefix_len,
                                        absl::Span<const int32_t> q_len, int num_heads,
                                        int reserved_sms = 0);

  int64_t plans_made() const { return plans_made_; }

 private:
  int num_sms_;
  int capacity_;
  uint64_t next_id_ = 1;
  int64_t plans_made_ = 0;
  std::deque<CachedPlan> entries_;  // most recent first
};

}  // namespace verifyd
