#include "executor/device_operations.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

// PrepareVerify accepted the call (and applied its commits): a later failure is a defect, not bad
// input, and the caller must know the commits already happened.
absl::Status AfterPrepare(const absl::Status& status, const std::string& step) {
  return absl::InternalError(absl::StrCat(
      "Verify failed after PrepareVerify applied its commits, at ", step, ": ", status.ToString()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceOperations>> DeviceOperations::Create(
    const DeviceOptions& options, std::unique_ptr<ComputeBackend> backend,
    ExecutorMetrics* metrics) {
  std::unique_ptr<DeviceOperations> ops(new DeviceOperations(std::move(backend), metrics));
  ops->backend_->SetGraphObserver([metrics](ComputeBackend::GraphEvent event) {
    switch (event) {
      case ComputeBackend::GraphEvent::kCapture:
        metrics->RecordGraphCapture();
        break;
      case ComputeBackend::GraphEvent::kReplay:
        metrics->RecordGraphReplay();
        break;
      case ComputeBackend::GraphEvent::kFallback:
        metrics->RecordGraphFallback();
        break;
    }
  });
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                           ops->backend_->CreateStorage(options.store.num_layers,
                                                        options.capacity_slots, options.kv_dtype));
  ops->store_ = std::make_unique<KvStore>(options.store, std::move(storage));
  ops->RefreshGauges();
  return ops;
}

std::string DeviceOperations::Item(int b) const {
  return absl::StrCat(store_->options().field_names.items, "[", b, "]");
}

absl::StatusOr<AppendResult> DeviceOperations::Append(const AppendCall& call) {
  const absl::Time start = absl::Now();
  VERIFYD_RETURN_IF_ERROR(store_->Append(call.sequence, call.layer_begin, call.layer_count,
                                         call.num_tokens, call.kv, call.expect, call.kv_memory,
                                         call.kv_dtype));
  metrics_->RecordKernel(KernelKind::kAppend, absl::Now() - start);
  AppendResult result;
  VERIFYD_ASSIGN_OR_RETURN(result.committed_length, store_->CommittedLength(call.sequence));
  VERIFYD_ASSIGN_OR_RETURN(result.layer_fill, store_->LayerFill(call.sequence));
  return result;
}

absl::Status DeviceOperations::GatherViews(const VerifyCall& call, VerifyResult* result) {
  const int batch = static_cast<int>(call.items.size());
  prefix_len_.assign(batch, 0);
  slot_indptr_.assign(1, 0);
  mask_indptr_.assign(1, 0);
  slots_.clear();
  slot_lists_.clear();
  mask_bits_.clear();
  tree_slots_.clear();
  const bool host_lists = backend_->needs_host_slot_lists();
  for (int b = 0; b < batch; ++b) {
    absl::StatusOr<VerifyView> view = store_->GetVerifyView(call.items[b].sequence);
    if (!view.ok()) return AfterPrepare(view.status(), absl::StrCat(Item(b), " view"));
    prefix_len_[b] = view->prefix_len;
    slot_lists_.push_back(VerifySlotList{call.items[b].sequence, view->slot_generation,
                                         view->prefix_slots, view->tree_slots});
    tree_slots_.insert(tree_slots_.end(), view->tree_slots.begin(), view->tree_slots.end());
    if (host_lists) {
      slots_.insert(slots_.end(), view->prefix_slots.begin(), view->prefix_slots.end());
      slots_.insert(slots_.end(), view->tree_slots.begin(), view->tree_slots.end());
      slot_indptr_.push_back(static_cast<int32_t>(slots_.size()));
    }
    mask_bits_.insert(mask_bits_.end(), view->mask->bits().begin(), view->mask->bits().end());
    mask_indptr_.push_back(static_cast<int32_t>(mask_bits_.size()));
    result->committed_length.push_back(view->prefix_len);
    metrics_->RecordTreeNodes(call.qo_indptr[b + 1] - call.qo_indptr[b]);
  }
  return absl::OkStatus();
}

VerifyProblem DeviceOperations::GatheredProblem(const VerifyCall& call) const {
  const bool host_lists = backend_->needs_host_slot_lists();
  VerifyProblem problem;
  problem.q = call.q;
  problem.num_heads = call.num_heads;
  problem.scale = call.scale;
  problem.batch = static_cast<int>(call.items.size());
  problem.total_q = call.total_q;
  problem.qo_indptr = call.qo_indptr.data();
  problem.prefix_len = prefix_len_.data();
  problem.slot_indptr = host_lists ? slot_indptr_.data() : nullptr;
  problem.slots = host_lists ? slots_.data() : nullptr;
  problem.mask_indptr = mask_indptr_.data();
  problem.mask_bits = mask_bits_.data();
  return problem;
}

void DeviceOperations::SettleValueChecks(SequenceId seq) {
  auto it = unsettled_.find(seq);
  if (it == unsettled_.end()) return;
  for (const auto& [layer, check] : it->second) {
    // A refused layer stays unwritten: the store's commit check names it.
    if (check->Wait().ok()) (void)store_->MarkTreeLayerWritten(seq, layer);
  }
  unsettled_.erase(it);
}

void DeviceOperations::SettleValueChecks(absl::Span<const VerifyItem> items) {
  if (unsettled_.empty()) return;
  for (const VerifyItem& item : items) {
    if (!item.commit) continue;
    // An empty path keeps none of the tree's rows: nothing to wait for, nothing to mark.
    if (item.commit->accepted_path.empty()) {
      unsettled_.erase(item.sequence);
    } else {
      SettleValueChecks(item.sequence);
    }
  }
}

absl::StatusOr<VerifyResult> DeviceOperations::Verify(const VerifyCall& call) {
  const bf16_bits* q = call.q;
  const bf16_bits* tree_kv = call.tree_kv;
  if (call.inputs_shared) {
    // Before anything changes (the riding commits): the call is refused on the values it would
    // use, copied out of memory its client may rewrite meanwhile (issue 33 N8).
    const int64_t q_shape[] = {call.total_q, call.num_heads, kKvDim};
    const int64_t kv_shape[] = {call.total_q, kKvDim};
    q_copy_.resize(static_cast<size_t>(call.total_q) * call.num_heads * kKvDim);
    tree_kv_copy_.resize(static_cast<size_t>(call.total_q) * kKvDim);
    VERIFYD_RETURN_IF_ERROR(CopyCheckingValueBound(q_copy_.data(), q, q_shape, "q"));
    VERIFYD_RETURN_IF_ERROR(
        CopyCheckingValueBound(tree_kv_copy_.data(), tree_kv, kv_shape, "tree_kv"));
    q = q_copy_.data();
    tree_kv = tree_kv_copy_.data();
  }
  SettleValueChecks(call.items);
  VERIFYD_RETURN_IF_ERROR(store_->PrepareVerify(call.layer, call.items));
  VerifyResult result;
  const int batch = static_cast<int>(call.items.size());
  for (int b = 0; b < batch; ++b) {
    const absl::Status written =
        store_->WriteTreeLayer(call.items[b].sequence, call.layer,
                               tree_kv + static_cast<size_t>(call.qo_indptr[b]) * kKvDim);
    if (!written.ok()) return AfterPrepare(written, absl::StrCat(Item(b), " tree KV"));
  }
  // The views' spans stay valid until the next mutating store call, which comes after the compute.
  if (absl::Status gathered = GatherViews(call, &result); !gathered.ok()) return gathered;
  metrics_->RecordVerifyBatch(batch);

  const int64_t rows = int64_t{call.total_q} * call.num_heads;
  bf16_bits* out_data = call.out_destination;
  if (out_data == nullptr) {
    result.out_bytes.resize(static_cast<size_t>(rows) * kVDim * sizeof(bf16_bits));
    out_data = reinterpret_cast<bf16_bits*>(result.out_bytes.data());
  }
  float* lse = call.return_lse ? call.lse_destination : nullptr;
  if (call.return_lse && lse == nullptr) {
    result.lse_bytes.resize(static_cast<size_t>(rows) * sizeof(float));
    lse = reinterpret_cast<float*>(result.lse_bytes.data());
  }

  VerifyProblem problem = GatheredProblem(call);
  problem.q = q;
  problem.out = out_data;
  problem.lse = lse;
  const absl::Time start = absl::Now();
  const absl::Status computed = backend_->ComputeVerify(call.layer, problem, slot_lists_);
  metrics_->RecordKernel(KernelKind::kVerify, absl::Now() - start);
  if (!computed.ok()) return AfterPrepare(computed, "compute");
  return result;
}

absl::StatusOr<CommitResult> DeviceOperations::Commit(const CommitCall& call) {
  if (call.path.accepted_path.empty()) {
    unsettled_.erase(call.sequence);  // keeps none of the tree's rows
  } else {
    SettleValueChecks(call.sequence);
  }
  VERIFYD_RETURN_IF_ERROR(store_->Commit(call.sequence, call.path));
  CommitResult result;
  VERIFYD_ASSIGN_OR_RETURN(result.committed_length, store_->CommittedLength(call.sequence));
  return result;
}

absl::Status DeviceOperations::FailExternal(const ExternalFailure& failure,
                                            const absl::Status& reason) {
  const absl::Status failed = backend_->FailVerifyExternal(failure);
  if (!failed.ok()) {
    return absl::Status(reason.code(), absl::StrCat(reason.message(),
                                                    " (and the outputs and done "
                                                    "flag could not be written: ",
                                                    failed.ToString(), ")"));
  }
  return reason;
}

absl::StatusOr<VerifyResult> DeviceOperations::VerifyExternal(const VerifyCall& call,
                                                              const ExternalOrder& order) {
  const int64_t rows = int64_t{call.total_q} * call.num_heads;
  const ExternalFailure failure{call.out_destination, rows * kVDim, call.lse_destination,
                                call.lse_destination != nullptr ? rows : 0, order};
  SettleValueChecks(call.items);
  const absl::Status prepared = store_->PrepareVerify(call.layer, call.items);
  if (!prepared.ok()) return FailExternal(failure, prepared);
  VerifyResult result;
  const int batch = static_cast<int>(call.items.size());
  if (absl::Status gathered = GatherViews(call, &result); !gathered.ok()) {
    return FailExternal(failure, gathered);
  }
  metrics_->RecordVerifyBatch(batch);

  ExternalVerify external;
  external.layer = call.layer;
  external.problem = GatheredProblem(call);
  external.problem.out = call.out_destination;
  external.problem.lse = call.lse_destination;
  external.tree_kv = call.tree_kv;
  external.tree_slots = tree_slots_;
  external.order = order;
  external.reserved_sms = call.reserved_sms;
  std::shared_ptr<ExternalValueCheck> value_check;
  external.value_check = &value_check;
  const absl::Time start = absl::Now();
  const absl::Status computed = backend_->ComputeVerifyExternal(external, slot_lists_);
  metrics_->RecordKernel(KernelKind::kVerify, absl::Now() - start);
  // A ready flag that never came, or tensors out of SPEC §1's bound (checked once ready), are the
  // scheduler's doing, not a defect: their own code. The layer stays unwritten in the store, so a
  // Commit of the tree is refused until it is verified again.
  if (computed.code() == absl::StatusCode::kDeadlineExceeded ||
      computed.code() == absl::StatusCode::kAborted ||
      computed.code() == absl::StatusCode::kInvalidArgument) {
    return computed;
  }
  if (!computed.ok()) return AfterPrepare(computed, "compute");
  // The backend wrote the rows inside the call's order; the store records that this layer of
  // each pending tree is written (so a later Commit accepts it) — once the device's value check
  // says so where it answers later (unsettled_).
  for (int b = 0; b < batch; ++b) {
    const SequenceId seq = call.items[b].sequence;
    if (value_check == nullptr) {
      const absl::Status marked = store_->MarkTreeLayerWritten(seq, call.layer);
      if (!marked.ok()) return AfterPrepare(marked, absl::StrCat(Item(b), " tree"));
      continue;
    }
    const absl::Status unmarked = store_->MarkTreeLayerUnwritten(seq, call.layer);
    if (!unmarked.ok()) return AfterPrepare(unmarked, absl::StrCat(Item(b), " tree"));
    auto& layers = unsettled_[seq];
    auto same = std::find_if(layers.begin(), layers.end(),
                             [&](const auto& entry) { return entry.first == call.layer; });
    if (same != layers.end()) {
      same->second = value_check;
    } else {
      layers.emplace_back(call.layer, value_check);
    }
  }
  result.value_check = std::move(value_check);
  return result;
}

absl::StatusOr<ReleaseResult> DeviceOperations::Release(const ReleaseCall& call) {
  const int64_t free_before = store_->Stats().free_slots;
  VERIFYD_RETURN_IF_ERROR(store_->Release(call.sequence));
  backend_->ForgetSequence(call.sequence);
  unsettled_.erase(call.sequence);
  return ReleaseResult{store_->Stats().free_slots - free_before};
}

absl::StatusOr<ForkResult> DeviceOperations::Fork(const ForkCall& call) {
  VERIFYD_RETURN_IF_ERROR(store_->Fork(call.source, call.fork, call.length));
  VERIFYD_ASSIGN_OR_RETURN(const int64_t committed, store_->CommittedLength(call.fork));
  return ForkResult{committed, store_->Stats().shared_slots};
}

DeviceStats DeviceOperations::Stats() const {
  DeviceStats stats;
  stats.backend = backend_->name();
  stats.mps_active = backend_->mps_active();
  stats.layers = store_->options().num_layers;
  stats.max_tree_nodes = store_->options().max_tree_nodes;
  stats.store = store_->Stats();
  metrics_->RecordStore(stats.store);
  return stats;
}

SequencePage DeviceOperations::ListSequences(const ListSequencesCall& call) const {
  return store_->ListSequences(call.after, call.limit);
}

int64_t DeviceOperations::ExpireLeases() {
  const std::vector<SequenceId> released = store_->ExpireLeases();
  for (SequenceId sequence : released) {
    backend_->ForgetSequence(sequence);
    unsettled_.erase(sequence);
    metrics_->OnLeaseExpired(sequence);
  }
  const int64_t expired = static_cast<int64_t>(released.size());
  if (expired > 0) metrics_->RecordLeaseExpiries(expired);
  return expired;
}

void DeviceOperations::RefreshGauges() const { metrics_->RecordStore(store_->Stats()); }

}  // namespace verifyd
