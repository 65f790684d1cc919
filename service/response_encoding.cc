#include "service/response_encoding.h"

#include <cstdint>

#include "absl/time/time.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

v1::CompactionStatus::State ToProtoState(CompactionOperation::State state) {
  switch (state) {
    case CompactionOperation::State::kPending:
      return v1::CompactionStatus::PENDING;
    case CompactionOperation::State::kRunning:
      return v1::CompactionStatus::RUNNING;
    case CompactionOperation::State::kDone:
      return v1::CompactionStatus::DONE;
    case CompactionOperation::State::kFailed:
      return v1::CompactionStatus::FAILED;
  }
  return v1::CompactionStatus::STATE_UNSPECIFIED;
}

}  // namespace

void EncodeAppend(const AppendResult& result, v1::AppendResponse* response) {
  response->set_committed_length(static_cast<uint64_t>(result.committed_length));
  for (int64_t f : result.layer_fill) response->add_layer_fill(static_cast<uint64_t>(f));
}

void EncodeVerify(const v1::VerifyRequest& request, const VerifyCall& call, VerifyResult result,
                  v1::VerifyResponse* response) {
  for (int64_t n : result.committed_length) {
    response->add_committed_length(static_cast<uint64_t>(n));
  }
  v1::Tensor* out = response->mutable_out();
  out->set_dtype(v1::DTYPE_BF16);
  out->add_shape(call.total_q);
  out->add_shape(call.num_heads);
  out->add_shape(kVDim);
  // A moved std::string keeps its buffer (responses are not arena-allocated): no copy of the bytes.
  if (call.out_destination != nullptr) {
    *out->mutable_shared_memory() = request.out_shared_memory();
  } else {
    out->set_inline_data(std::move(result.out_bytes));
  }
  if (!call.return_lse) return;
  v1::Tensor* lse = response->mutable_lse();
  lse->set_dtype(v1::DTYPE_FP32);
  lse->add_shape(call.total_q);
  lse->add_shape(call.num_heads);
  if (call.lse_destination != nullptr) {
    *lse->mutable_shared_memory() = request.lse_shared_memory();
  } else {
    lse->set_inline_data(std::move(result.lse_bytes));
  }
}

void EncodeCommit(const CommitResult& result, v1::CommitResponse* response) {
  response->set_committed_length(static_cast<uint64_t>(result.committed_length));
}

void EncodeRelease(const ReleaseResult& result, v1::ReleaseResponse* response) {
  response->set_freed_slots(static_cast<uint64_t>(result.freed_slots));
}

void EncodeFork(const ForkResult& result, v1::ForkResponse* response) {
  response->set_committed_length(static_cast<uint64_t>(result.committed_length));
  response->set_shared_tokens(static_cast<uint64_t>(result.shared_slots));
}

void EncodeStats(const DeviceStats& stats, int heads, float softmax_scale,
                 v1::StatsResponse* response) {
  const StoreStats& store = stats.store;
  response->set_backend(stats.backend);
  response->set_mps_active(stats.mps_active);
  response->set_layers(static_cast<uint32_t>(stats.layers));
  response->set_heads(static_cast<uint32_t>(heads));
  response->set_max_tree_nodes(static_cast<uint32_t>(stats.max_tree_nodes));
  response->set_capacity_tokens(static_cast<uint64_t>(store.capacity_slots));
  response->set_used_tokens(static_cast<uint64_t>(store.used_slots));
  response->set_free_tokens(static_cast<uint64_t>(store.free_slots));
  response->set_pending_tokens(static_cast<uint64_t>(store.pending_slots));
  response->set_largest_free_run(static_cast<uint64_t>(store.largest_free_run));
  EncodeFragmentation(store.fragmentation, response->mutable_fragmentation());
  response->set_softmax_scale(softmax_scale);
  response->set_shared_tokens(static_cast<uint64_t>(store.shared_slots));
  response->set_shared_references(static_cast<uint64_t>(store.shared_references));
  response->set_kv_dtype(KvDtypeName(store.kv_dtype));
  response->set_kv_bytes_per_token(static_cast<uint32_t>(store.row_bytes));
  response->set_kv_pool_bytes(static_cast<uint64_t>(store.pool_bytes));
}

void EncodeSequences(const SequencePage& page, v1::ListSequencesResponse* response) {
  response->mutable_sequences()->Reserve(static_cast<int>(page.sequences.size()));
  for (const SequenceSummary& summary : page.sequences) {
    v1::SequenceInfo* info = response->add_sequences();
    info->set_sequence_id(summary.id);
    info->set_committed_length(static_cast<uint64_t>(summary.committed_length));
    info->set_pending_tree_nodes(static_cast<uint32_t>(summary.pending_nodes));
    info->set_idle_seconds(absl::ToDoubleSeconds(summary.idle));
    info->set_lease_remaining_seconds(absl::ToDoubleSeconds(summary.lease_left));
    info->set_shared_tokens(static_cast<uint64_t>(summary.shared_slots));
  }
  response->set_truncated(page.truncated);
  response->set_total_sequences(static_cast<uint64_t>(page.total));
}

void EncodeCompactionStatus(const CompactionOperation& op, v1::CompactionStatus* response) {
  response->set_operation_id(op.id);
  response->set_state(ToProtoState(op.state));
  response->set_bytes_planned(static_cast<uint64_t>(op.bytes_planned));
  response->set_bytes_moved(static_cast<uint64_t>(op.bytes_moved));
  response->set_tokens_moved(static_cast<uint64_t>(op.tokens_moved));
  // Fragmentation before is known once the operation started, after once it ended.
  if (op.state != CompactionOperation::State::kPending) {
    EncodeFragmentation(op.before, response->mutable_before());
  }
  if (op.state == CompactionOperation::State::kDone ||
      op.state == CompactionOperation::State::kFailed) {
    EncodeFragmentation(op.after, response->mutable_after());
  }
  response->set_seconds(absl::ToDoubleSeconds(op.copy_time));
  response->set_bytes_per_second(op.bytes_per_second());
  response->set_error(op.error);
  response->set_note(op.note);
}

void EncodeFragmentation(const FragmentationStats& stats, v1::Fragmentation* out) {
  out->set_sequences(static_cast<uint64_t>(stats.sequences));
  out->set_tokens(static_cast<uint64_t>(stats.tokens));
  out->set_runs(static_cast<uint64_t>(stats.runs));
  out->set_tokens_outside_first_run(static_cast<uint64_t>(stats.tokens_outside_first_run));
  out->set_fragmented_ratio(stats.fragmented_ratio());
}

}  // namespace verifyd
