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
#include "executor/executor_metrics.h"
#include "kvstore/kv_store.h"

namespace verifyd {

struct CompactionOperation {
  enum class State { kPending, kRunning, kDone, kFailed };
  std::string id;
  State state = State::kPending;
  int64_t budget_bytes = 0;      // 0: until converged (then bounded: Step)
  int64_t budget_requested = 0;  // as the caller asked
  int64_t bytes_planned = 0;
  int64_t bytes_moved = 0;
  int64_t tokens_moved = 0;  // slots moved (each one row on every layer)
  FragmentationStats before;
  FragmentationStats after;
  // Executor time spent on the operation: plans, ExecuteCompaction, and the final wait for the
  // copies still running on the device when it ends (chunks overlap their copy with the next
  // chunk's bookkeeping), so bytes_moved / copy_time is the operation's real throughput. Only
  // the fragmentation statistics before and after are left out.
  absl::Duration copy_time;
  // Host time by kind (for attributing the end-to-end figure): PlanCompaction calls and the final
  // wait (both also counted in copy_time), Stats() before and after; plans made and chunks run.
  absl::Duration plan_time;
  absl::Duration stats_time;
  absl::Duration final_wait_time;
  int64_t plans = 0;
  int64_t chunks = 0;
  std::string error;
  // A finished operation's reason for stopping where it did (done: converged, the budget, or no
  // free run large enough for what is left), for the response and the log.
  std::string note;
  double bytes_per_second() const {
    const double s = absl::ToDoubleSeconds(copy_time);
    return s > 0 ? static_cast<double>(bytes_moved) / s : 0.0;
  }
};

class CompactionManager {
 public:
  // chunk_bytes: the most one Step copies (0: ChunkBytesFor the cpu backend).
  CompactionManager(int history, int64_t chunk_bytes, ExecutorMetrics* metrics);

  // The chunk size for chunk_bytes 0 (auto), by backend name: a chunk holds the
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
  // Why an operation that did not fail stops.
  enum class Stop { kFailed, kBudget, kNothingToPlan };
  void FinishLocked(CompactionOperation& op, KvStore& store, Stop why);
  static std::string StopNote(const CompactionOperation& op, const KvStore& store, Stop why);
  // Plans afresh for `op`: its remaining budget, and unless `whole` at most kPlanChunks chunks.
  // Counts the time in op.plan_time.
  void ReplanLocked(CompactionOperation& op, KvStore& store, bool whole);
  static constexpr int64_t kPlanChunks = 4;
  // The slots of the next chunk: the plan's remainder cut into equal chunks of at most the chunk
  // size, and within the budget.
  int64_t NextChunkSlotsLocked(const CompactionOperation& op, int64_t move_bytes) const;

  const int history_;
  const int64_t chunk_bytes_;
  // Executor thread only. Planning walks every fragmented sequence, so one plan serves many
  // chunks; a chunk the store rejects as stale (traffic moved a slot since) changes nothing and
  // forces a fresh plan. A chunk may end inside a run: the cursor is a run and an offset in it.
  // When a chunk uses the plan up, the next plan is made in the same Step, while that chunk's
  // copy still runs on the device (plans/0011); it may be stale by the next Step.
  struct PlanCursor {
    size_t run = 0;
    int32_t offset = 0;
  };
  std::string plan_op_id_;
  CompactionPlan plan_;
  PlanCursor cursor_;
  int64_t plan_slots_left_ = 0;  // slots of plan_ past the cursor
  ExecutorMetrics* metrics_;
  mutable std::mutex mu_;
  std::deque<CompactionOperation> operations_;  // oldest first
  uint64_t next_id_ = 1;
  const std::string id_prefix_;  // "compact-<8 random hex digits>-"
};

}  // namespace verifyd
