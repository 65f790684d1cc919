#include "service/compaction_manager.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/mla_dims.h"

namespace verifyd {

CompactionManager::CompactionManager(int history, int64_t chunk_bytes, ServiceMetrics* metrics)
    : history_(history), chunk_bytes_(chunk_bytes), metrics_(metrics) {}

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

void CompactionManager::FinishLocked(CompactionOperation& op, const KvStore& store, bool done) {
  op.state = done ? CompactionOperation::State::kDone : CompactionOperation::State::kFailed;
  op.after = store.Stats().fragmentation;
  metrics_->RecordCompactionFinished(done);
}

bool CompactionManager::Step(KvStore& store) {
  std::lock_guard<std::mutex> lock(mu_);
  CompactionOperation* op = OldestUnfinishedLocked();
  if (op == nullptr) return false;
  // One move copies a row on every layer.
  const int64_t move_bytes = int64_t{kKvRowBytes} * store.storage().num_layers();
  if (op->state == CompactionOperation::State::kPending) {
    op->state = CompactionOperation::State::kRunning;
    op->before = store.Stats().fragmentation;
    const int64_t whole =
        op->budget_bytes > 0 ? op->budget_bytes : std::numeric_limits<int64_t>::max() / 2;
    op->bytes_planned = store.PlanCompaction(whole).bytes();
    // "Until converged" is bounded too: traffic between chunks may undo some moves, and a
    // plan that never converges must not run forever.
    if (op->budget_bytes == 0) op->budget_bytes = std::max(2 * op->bytes_planned, move_bytes);
  }
  const int64_t remaining = op->budget_bytes - op->bytes_moved;
  const int64_t chunk = std::min(remaining, std::max(chunk_bytes_, move_bytes));
  const CompactionPlan plan = store.PlanCompaction(chunk);
  if (plan.moves.empty()) {
    FinishLocked(*op, store, /*done=*/true);
    return OldestUnfinishedLocked() != nullptr;
  }
  const absl::Time start = absl::Now();
  const absl::Status status = store.ExecuteCompaction(plan);
  const absl::Duration took = absl::Now() - start;
  if (!status.ok()) {
    op->error = std::string(status.message());
    FinishLocked(*op, store, /*done=*/false);
    return OldestUnfinishedLocked() != nullptr;
  }
  op->bytes_moved += plan.bytes();
  // Traffic between chunks can add work the first plan did not see; progress never passes 100%.
  op->bytes_planned = std::max(op->bytes_planned, op->bytes_moved);
  op->tokens_moved += static_cast<int64_t>(plan.moves.size());
  op->copy_time += took;
  metrics_->RecordCompactionChunk(plan.bytes(), took);
  metrics_->RecordKernel(KernelKind::kCompact, took);
  if (op->bytes_moved >= op->budget_bytes) FinishLocked(*op, store, /*done=*/true);
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
