// Compact operations: created by the handler (returns an id at once), run by the executor in
// chunks between other work, queried by GetCompaction. The last `history` operations are kept.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

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
  int64_t tokens_moved = 0;  // slots moved (each one row on every layer)
  FragmentationStats before;
  FragmentationStats after;
  // Executor time spent in ExecuteCompaction, plus the final wait for the copies still running
  // on the device when the operation ends (chunks overlap their copy with the next chunk's
  // bookkeeping), so bytes_moved / copy_time is the operation's real throughput.
  absl::Duration copy_time;
  std::string error;
  double bytes_per_second() const {
    const double s = absl::ToDoubleSeconds(copy_time);
    return s > 0 ? static_cast<double>(bytes_moved) / s : 0.0;
  }
};

class CompactionManager {
 public:
  // chunk_bytes: the most one Step copies (0: ChunkBytesFor the cpu backend).
  CompactionManager(int history, int64_t chunk_bytes, ServiceMetrics* metrics);

  // The chunk size for --compaction-chunk-bytes=0 (auto), by backend name: a chunk holds the
  // executor (Verify waits behind it), but each chunk also pays a fixed host and launch cost;
  // reasoning and measurements in plans/0011-run-compaction.md.
  static int64_t ChunkBytesFor(std::string_view backend_name);

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
  // Waits for the copies still in flight (their time joins op.copy_time), then records the end.
  void FinishLocked(CompactionOperation& op, KvStore& store, bool done);

  const int history_;
  const int64_t chunk_bytes_;
  // Executor thread only. Planning walks every fragmented sequence, so one plan serves many
  // chunks; a chunk the store rejects as stale (traffic moved a slot since) changes nothing and
  // forces a fresh plan. A chunk may end inside a run: the cursor is a run and an offset in it.
  struct PlanCursor {
    size_t run = 0;
    int32_t offset = 0;
    bool at_start() const { return run == 0 && offset == 0; }
  };
  std::string plan_op_id_;
  CompactionPlan plan_;
  PlanCursor cursor_;
  ServiceMetrics* metrics_;
  mutable std::mutex mu_;
  std::deque<CompactionOperation> operations_;  // oldest first
  uint64_t next_id_ = 1;
};

}  // namespace verifyd
