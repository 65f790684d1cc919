// Compact operations: created by the handler (returns an id at once), run by the executor in
// chunks between other work, queried by GetCompaction. The last `history` operations are kept.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvstore/kv_store.h"
#include "service/service_metrics.h"

namespace verifyd {

struct CompactionOperation {
  enum class State { kPending, kRunning, kDone, kFailed };
  std::string id;
  State state = State::kPending;
  int64_t budget_bytes = 0;  // 0: until converged
  int64_t bytes_planned = 0;
  int64_t bytes_moved = 0;
  int64_t tokens_moved = 0;
  FragmentationStats before;
  FragmentationStats after;
  absl::Duration copy_time;  // time spent in ExecuteCompaction
  std::string error;
  double bytes_per_second() const {
    const double s = absl::ToDoubleSeconds(copy_time);
    return s > 0 ? static_cast<double>(bytes_moved) / s : 0.0;
  }
};

class CompactionManager {
 public:
  // chunk_bytes: the most one Step copies.
  CompactionManager(int history, int64_t chunk_bytes, ServiceMetrics* metrics);

  // Thread-safe.
  std::string Create(int64_t budget_bytes);
  std::optional<CompactionOperation> Get(const std::string& id) const;

  // Executor thread only: one chunk of the oldest unfinished operation. True while work remains.
  bool Step(KvStore& store);
  // Executor thread only, at shutdown: unfinished operations become FAILED.
  void AbandonAll(const std::string& reason);

 private:
  CompactionOperation* FindLocked(const std::string& id);
  CompactionOperation* OldestUnfinishedLocked();
  void FinishLocked(CompactionOperation& op, const KvStore& store, bool done);

  const int history_;
  const int64_t chunk_bytes_;
  // Executor thread only. Planning is O(capacity), so one plan serves many chunks; a chunk the
  // store rejects as stale (traffic moved a slot since) changes nothing and forces a fresh plan.
  std::string plan_op_id_;
  CompactionPlan plan_;
  size_t plan_cursor_ = 0;
  ServiceMetrics* metrics_;
  mutable std::mutex mu_;
  std::deque<CompactionOperation> operations_;  // oldest first
  uint64_t next_id_ = 1;
};

}  // namespace verifyd
