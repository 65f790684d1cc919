#include "backend/cuda/cuda_plan_cache.h"

#include <algorithm>

#include "base/status_macros.h"

namespace verifyd {

absl::StatusOr<const CachedPlan*> SplitPlanCache::Get(absl::Span<const int32_t> prefix_len,
                                                      absl::Span<const int32_t> q_len,
                                                      int num_heads, int reserved_sms) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->num_heads == num_heads && it->reserved_sms == reserved_sms &&
        absl::MakeConstSpan(it->prefix_len) == prefix_len &&
        absl::MakeConstSpan(it->q_len) == q_len) {
      if (it != entries_.begin()) {
        CachedPlan hit = std::move(*it);
        entries_.erase(it);
        entries_.push_front(std::move(hit));
      }
      return &entries_.front();
    }
  }
  CachedPlan fresh;
  VERIFYD_ASSIGN_OR_RETURN(
      fresh.plan, PlanSplits(prefix_len, q_len, num_heads, std::max(1, num_sms_ - reserved_sms)));
  fresh.id = next_id_++;
  fresh.num_heads = num_heads;
  fresh.reserved_sms = reserved_sms;
  fresh.prefix_len.assign(prefix_len.begin(), prefix_len.end());
  fresh.q_len.assign(q_len.begin(), q_len.end());
  fresh.layout = LayoutWorkspace(fresh.plan);
  fresh.packed = PackPlan(fresh.plan, fresh.layout);
  ++plans_made_;
  entries_.push_front(std::move(fresh));
  while (static_cast<int>(entries_.size()) > std::max(capacity_, 1)) entries_.pop_back();
  return &entries_.front();
}

}  // namespace verifyd
