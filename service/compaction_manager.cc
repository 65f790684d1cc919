#include "service/compaction_manager.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/mla_dims.h"

namespace verifyd {

CompactionManager::CompactionManager(int history, int64_t chunk_bytes, ServiceMetrics* metrics)
    : history_(history),
      chunk_bytes_(chunk_bytes > 0 ? chunk_bytes : ChunkBytesFor("cpu")),
      metrics_(metrics) {}

std::string CompactionManager::Create(int64_t budget_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  CompactionOperation op;
  op.id = absl::StrCat("compact-", next_id_++);
  op.budget_bytes = budget_bytes;
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

void CompactionManager::FinishLocked(CompactionOperation& op, KvStore& store, bool done) {
  const absl::Time start = absl::Now();
  const absl::Status waited = store.storage().WaitForCopies();
  const absl::Duration took = absl::Now() - start;
  op.copy_time += took;
  metrics_->RecordCompactionChunk(0, took);
  if (!waited.ok()) {
    done = false;
    if (op.error.empty()) op.error = std::string(waited.message());
  }
  op.state = done ? CompactionOperation::State::kDone : CompactionOperation::State::kFailed;
  op.after = store.Stats().fragmentation;
  metrics_->RecordCompactionFinished(done);
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
  const int64_t move_bytes = int64_t{kKvRowBytes} * store.storage().num_layers();
  const auto replan = [&] {
    const int64_t remaining = op->budget_bytes > 0 ? op->budget_bytes - op->bytes_moved
                                                   : std::numeric_limits<int64_t>::max() / 2;
    plan_ = store.PlanCompaction(remaining);
    cursor_ = PlanCursor{};
    plan_op_id_ = op->id;
  };
  if (op->state == CompactionOperation::State::kPending) {
    op->state = CompactionOperation::State::kRunning;
    op->before = store.Stats().fragmentation;
    replan();
    op->bytes_planned = plan_.bytes();
    // "Until converged" is bounded too: traffic between chunks may undo some moves, and a
    // plan that never converges must not run forever.
    if (op->budget_bytes == 0) op->budget_bytes = std::max(2 * op->bytes_planned, move_bytes);
  } else if (plan_op_id_ != op->id || cursor_.run >= plan_.runs.size()) {
    replan();  // the plan is used up: traffic since may have left more to do
  }
  if (plan_.runs.empty() || op->bytes_moved + move_bytes > op->budget_bytes) {
    FinishLocked(*op, store, /*done=*/true);
    return OldestUnfinishedLocked() != nullptr;
  }
  const int64_t budget_slots = (op->budget_bytes - op->bytes_moved) / move_bytes;
  const int64_t chunk_slots =
      std::min(std::max<int64_t>(1, chunk_bytes_ / move_bytes), budget_slots);
  PlanCursor next = cursor_;
  CompactionPlan chunk = TakeChunk(plan_, next.run, next.offset, chunk_slots);
  const absl::Time start = absl::Now();
  absl::Status status = store.ExecuteCompaction(chunk);
  if (!status.ok() && !cursor_.at_start()) {
    // Stale: the store changed nothing. Plan afresh against the store as it is now.
    replan();
    next = cursor_;
    chunk = TakeChunk(plan_, next.run, next.offset, chunk_slots);
    status = store.ExecuteCompaction(chunk);
  }
  const absl::Duration took = absl::Now() - start;
  if (!status.ok()) {
    op->error = std::string(status.message());
    FinishLocked(*op, store, /*done=*/false);
    return OldestUnfinishedLocked() != nullptr;
  }
  cursor_ = next;
  const int64_t chunk_slots_moved = chunk.slots();
  op->bytes_moved += chunk.bytes();
  // Traffic between chunks can add work the first plan did not see; progress never passes 100%.
  op->bytes_planned = std::max(op->bytes_planned, op->bytes_moved);
  op->tokens_moved += chunk_slots_moved;
  op->copy_time += took;
  metrics_->RecordCompactionChunk(chunk.bytes(), took);
  metrics_->RecordKernel(KernelKind::kCompact, took);
  if (chunk_slots_moved == 0 || op->bytes_moved >= op->budget_bytes) {
    FinishLocked(*op, store, /*done=*/true);
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
    }
  }
}

}  // namespace verifyd
