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
  const auto replan = [&] {
    const int64_t remaining = op->budget_bytes > 0 ? op->budget_bytes - op->bytes_moved
                                                   : std::numeric_limits<int64_t>::max() / 2;
    plan_ = store.PlanCompaction(remaining);
    plan_cursor_ = 0;
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
  } else if (plan_op_id_ != op->id || plan_cursor_ >= plan_.moves.size()) {
    replan();  // the plan is used up: traffic since may have left more to do
  }
  if (plan_.moves.empty() || op->bytes_moved + move_bytes > op->budget_bytes) {
    FinishLocked(*op, store, /*done=*/true);
    return OldestUnfinishedLocked() != nullptr;
  }
  const int64_t budget_moves = (op->budget_bytes - op->bytes_moved) / move_bytes;
  const int64_t chunk_moves =
      std::min({std::max<int64_t>(1, chunk_bytes_ / move_bytes), budget_moves,
                static_cast<int64_t>(plan_.moves.size() - plan_cursor_)});
  CompactionPlan chunk;
  chunk.bytes_per_move = plan_.bytes_per_move;
  chunk.moves.assign(plan_.moves.begin() + plan_cursor_,
                     plan_.moves.begin() + plan_cursor_ + chunk_moves);
  const absl::Time start = absl::Now();
  absl::Status status = store.ExecuteCompaction(chunk);
  if (!status.ok() && plan_cursor_ > 0) {
    // Stale: the store changed nothing. Plan afresh against the store as it is now.
    replan();
    chunk.moves.assign(plan_.moves.begin(),
                       plan_.moves.begin() + std::min<size_t>(chunk_moves, plan_.moves.size()));
    status = chunk.moves.empty() ? absl::OkStatus() : store.ExecuteCompaction(chunk);
  }
  const absl::Duration took = absl::Now() - start;
  if (!status.ok()) {
    op->error = std::string(status.message());
    FinishLocked(*op, store, /*done=*/false);
    return OldestUnfinishedLocked() != nullptr;
  }
  plan_cursor_ += chunk.moves.size();
  op->bytes_moved += chunk.bytes();
  // Traffic between chunks can add work the first plan did not see; progress never passes 100%.
  op->bytes_planned = std::max(op->bytes_planned, op->bytes_moved);
  op->tokens_moved += static_cast<int64_t>(chunk.moves.size());
  op->copy_time += took;
  metrics_->RecordCompactionChunk(chunk.bytes(), took);
  metrics_->RecordKernel(KernelKind::kCompact, took);
  if (chunk.moves.empty() || op->bytes_moved >= op->budget_bytes) {
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
