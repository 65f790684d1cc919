#include "executor/compaction_manager.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/random.h"
#include "verify/mla_dims.h"

namespace verifyd {

CompactionManager::CompactionManager(int history, int64_t chunk_bytes, ExecutorMetrics* metrics)
    : history_(history),
      chunk_bytes_(chunk_bytes > 0 ? chunk_bytes : ChunkBytesFor("cpu")),
      metrics_(metrics),
      // Random per daemon run: ids never repeat across restarts, so a poller that outlives one
      // cannot read another run's operation under the id it holds (issue 17).
      id_prefix_(absl::StrCat("compact-", RandomHex(4), "-")) {}

std::string CompactionManager::Create(int64_t budget_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  CompactionOperation op;
  op.id = absl::StrCat(id_prefix_, next_id_++);
  op.budget_bytes = budget_bytes;
  op.budget_requested = budget_bytes;
  operations_.push_back(op);
  // Forget the oldest finished operations beyond the history; unfinished ones stay.
  while (static_cast<int>(operations_.size()) > history_) {
    auto it = std::find_if(operations_.begin(), operations_.end(), [](const auto& o) {
      return o.state == CompactionOperation::State::kDone ||
             o.state == CompactionOperation::State::kFailed;
    });
    if (it == operations_.end()) break;
    operations_.erase(it);
  }
  return op.id;
}

std::optional<CompactionOperation> CompactionManager::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& op : operations_) {
    if (op.id == id) return op;
  }
  return std::nullopt;
}

CompactionOperation* CompactionManager::OldestUnfinishedLocked() {
  for (auto& op : operations_) {
    if (op.state == CompactionOperation::State::kPending ||
        op.state == CompactionOperation::State::kRunning) {
      return &op;
    }
  }
  return nullptr;
}

void CompactionManager::FinishLocked(CompactionOperation& op, KvStore& store, Stop why) {
  bool done = why != Stop::kFailed;
  const absl::Time start = absl::Now();
  const absl::Status waited = store.storage().WaitForCopies();
  const absl::Duration took = absl::Now() - start;
  op.copy_time += took;
  op.final_wait_time += took;
  metrics_->RecordCompactionChunk(0, took);
  if (!waited.ok()) {
    done = false;
    if (op.error.empty()) op.error = std::string(waited.message());
  }
  op.state = done ? CompactionOperation::State::kDone : CompactionOperation::State::kFailed;
  const absl::Time stats_start = absl::Now();
  op.after = store.Stats().fragmentation;
  op.stats_time += absl::Now() - stats_start;
  if (done) op.note = StopNote(op, store, why);
  metrics_->RecordCompactionFinished(done);
  metrics_->OnCompactionFinished(op);
}

std::string CompactionManager::StopNote(const CompactionOperation& op, const KvStore& store,
                                        Stop why) {
  const int64_t move_bytes = int64_t{store.storage().row_bytes()} * store.storage().num_layers();
  if (why == Stop::kBudget && op.budget_requested == 0) {
    return absl::StrCat("stopped at twice the first plan (", op.budget_bytes,
                        " bytes: budget_bytes = 0 runs until converged, bounded so that traffic "
                        "cannot keep it going), ",
                        op.bytes_moved, " moved; compact again");
  }
  if (why == Stop::kBudget) {
    return absl::StrCat("stopped at the budget: budget_bytes = ", op.budget_bytes, ", ",
                        op.bytes_moved, " moved, and one more token moves ", move_bytes,
                        " bytes (all layers)");
  }
  if (op.after.tokens_outside_first_run == 0) {
    return op.bytes_moved == 0 ? "nothing to move: every sequence is one contiguous run already"
                               : "converged: every sequence is one contiguous run";
  }
  return absl::StrCat(
      "no free run is large enough for what is left: ", op.after.tokens_outside_first_run,
      " tokens lie outside their sequences' first runs; release sequences (or let traffic free "
      "space) and compact again");
}

void CompactionManager::ReplanLocked(CompactionOperation& op, KvStore& store, bool whole) {
  int64_t remaining = op.budget_bytes > 0 ? op.budget_bytes - op.bytes_moved
                                          : std::numeric_limits<int64_t>::max() / 2;
  // A plan costs about its slots (plus a pass over the fragmented sequences): bounded, it stays
  // shorter than the copies queued on the device while it is made, and a Step never holds the
  // executor for a whole store's plan. The planner resumes where a bounded plan stopped.
  if (!whole) remaining = std::min(remaining, kPlanChunks * chunk_bytes_);
  const absl::Time start = absl::Now();
  plan_ = store.PlanCompaction(remaining);
  const absl::Duration planned = absl::Now() - start;
  op.plan_time += planned;
  // Planning is part of the operation's time: the device copies queued chunks meanwhile, and a
  // throughput that left it out would claim more than the device copied (plans/0011).
  op.copy_time += planned;
  ++op.plans;
  cursor_ = PlanCursor{};
  plan_slots_left_ = plan_.slots();
  plan_op_id_ = op.id;
}

int64_t CompactionManager::NextChunkSlotsLocked(const CompactionOperation& op,
                                                int64_t move_bytes) const {
  const int64_t max_slots = std::max<int64_t>(1, chunk_bytes_ / move_bytes);
  // Equal chunks: a sliver at the end of a plan would leave the device almost nothing queued
  // while the next plan is made.
  const int64_t pieces = (plan_slots_left_ + max_slots - 1) / max_slots;
  const int64_t slots = pieces > 0 ? (plan_slots_left_ + pieces - 1) / pieces : max_slots;
  return std::min(slots, (op.budget_bytes - op.bytes_moved) / move_bytes);
}

namespace {

// Up to max_slots slots of `plan` starting at run `run`, `offset` slots into it; a run cut by
// the limit continues in the next chunk. Advances run/offset past what it took.
CompactionPlan TakeChunk(const CompactionPlan& plan, size_t& run, int32_t& offset,
                         int64_t max_slots) {
  CompactionPlan chunk;
  chunk.bytes_per_slot = plan.bytes_per_slot;
  while (max_slots > 0 && run < plan.runs.size()) {
    const CompactionRun& whole = plan.runs[run];
    const auto take = static_cast<int32_t>(std::min<int64_t>(whole.length - offset, max_slots));
    chunk.runs.push_back({whole.sequence, whole.position + offset, whole.src_begin + offset,
                          whole.dst_begin + offset, take});
    max_slots -= take;
    offset += take;
    if (offset == whole.length) {
      ++run;
      offset = 0;
    }
  }
  return chunk;
}

}  // namespace

int64_t CompactionManager::ChunkBytesFor(std::string_view backend_name) {
  // cuda: ~160 µs of copying on an H200 per 256 MiB chunk, against ~25 µs of host work per chunk
  // (plan slice, checks, run upload) that overlaps the previous chunk's copy; at 64 MiB the host
  // share left the operation at 0.44 of D2D end to end (plans/0011). A Verify queued behind a
  // chunk waits at most one chunk. cpu: memcpy at a few GB/s, ~1 ms a chunk.
  return backend_name == "cuda" ? int64_t{256} << 20 : int64_t{4} << 20;
}

bool CompactionManager::Step(KvStore& store) {
  std::lock_guard<std::mutex> lock(mu_);
  CompactionOperation* op = OldestUnfinishedLocked();
  if (op == nullptr) return false;
  // One slot moved copies a row on every layer.
  const int64_t move_bytes = int64_t{store.storage().row_bytes()} * store.storage().num_layers();
  // Only a plan made in this Step is known to be current: between Steps the executor runs traffic.
  bool planned_now = false;
  if (op->state == CompactionOperation::State::kPending) {
    op->state = CompactionOperation::State::kRunning;
    const absl::Time stats_start = absl::Now();
    op->before = store.Stats().fragmentation;
    op->stats_time += absl::Now() - stats_start;
    ReplanLocked(*op, store, /*whole=*/true);  // its size is the operation's budget and progress
    planned_now = true;
    op->bytes_planned = plan_.bytes();
    // "Until converged" is bounded too: traffic between chunks may undo some moves, and a
    // plan that never converges must not run forever.
    if (op->budget_bytes == 0) op->budget_bytes = std::max(2 * op->bytes_planned, move_bytes);
  } else if (plan_op_id_ != op->id || cursor_.run >= plan_.runs.size()) {
    ReplanLocked(*op, store,
                 /*whole=*/false);  // the plan is used up: traffic since may have left more to do
    planned_now = true;
  }
  if (plan_.runs.empty() || op->bytes_moved + move_bytes > op->budget_bytes) {
    FinishLocked(*op, store, plan_.runs.empty() ? Stop::kNothingToPlan : Stop::kBudget);
    return OldestUnfinishedLocked() != nullptr;
  }
  PlanCursor next = cursor_;
  CompactionPlan chunk =
      TakeChunk(plan_, next.run, next.offset, NextChunkSlotsLocked(*op, move_bytes));
  absl::Time start = absl::Now();
  absl::Status status = store.ExecuteCompaction(chunk);
  absl::Duration took = absl::Now() - start;
  if (!status.ok() && !planned_now) {
    // Stale: the store changed nothing. Plan afresh against the store as it is now.
    ReplanLocked(*op, store, /*whole=*/false);
    next = cursor_;
    chunk = TakeChunk(plan_, next.run, next.offset, NextChunkSlotsLocked(*op, move_bytes));
    start = absl::Now();
    status = store.ExecuteCompaction(chunk);
    took += absl::Now() - start;
  }
  if (!status.ok()) {
    op->error = std::string(status.message());
    FinishLocked(*op, store, Stop::kFailed);
    return OldestUnfinishedLocked() != nullptr;
  }
  cursor_ = next;
  const int64_t chunk_slots_moved = chunk.slots();
  plan_slots_left_ -= chunk_slots_moved;
  op->bytes_moved += chunk.bytes();
  // Traffic between chunks can add work the first plan did not see; progress never passes 100%.
  op->bytes_planned = std::max(op->bytes_planned, op->bytes_moved);
  op->tokens_moved += chunk_slots_moved;
  op->copy_time += took;
  ++op->chunks;
  metrics_->RecordCompactionChunk(chunk.bytes(), took);
  metrics_->RecordKernel(KernelKind::kCompact, took);
  if (chunk_slots_moved == 0 || op->bytes_moved >= op->budget_bytes) {
    FinishLocked(*op, store, chunk_slots_moved == 0 ? Stop::kNothingToPlan : Stop::kBudget);
  } else if (cursor_.run >= plan_.runs.size()) {
    // The plan is used up: make the next one now, while this chunk's copy (and the previous one's)
    // still runs on the device, not at the start of the next Step, by which time the executor's
    // other work may have let the device run dry (plans/0011). It may be stale by then: see above.
    ReplanLocked(*op, store, /*whole=*/false);
    if (plan_.runs.empty()) FinishLocked(*op, store, Stop::kNothingToPlan);
  }
  return OldestUnfinishedLocked() != nullptr;
}

void CompactionManager::AbandonAll(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& op : operations_) {
    if (op.state == CompactionOperation::State::kPending ||
        op.state == CompactionOperation::State::kRunning) {
      op.state = CompactionOperation::State::kFailed;
      op.error = reason;
      metrics_->RecordCompactionFinished(false);
      metrics_->OnCompactionFinished(op);
    }
  }
}

}  // namespace verifyd
