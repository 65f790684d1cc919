#include "executor/device_operations.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "verify/mla_dims.h"
#include "base/status_macros.h"

namespace verifyd {
namespace {

// PrepareVerify accepted the call (and applied its commits): a later failure is a defect, not bad
// input, and the caller must know the commits already happened.
absl::Status AfterPrepare(const absl::Status& status, const std::string& step) {
  return absl::InternalError(absl::StrCat(
      "Verify failed after PrepareVerify applied its commits, at ", step, ": ", status.ToString()));
}

// The store names its own parameters ("items[2].sequence"); the caller knows the request's
// fields ("sequences[2].sequence_id"). The code is kept.
absl::Status RenameFields(
    const absl::Status& status,
    std::initializer_list<std::pair<absl::string_view, absl::string_view>> renames) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrReplaceAll(status.message(), renames));
}

}  // namespace

absl::StatusOr<int64_t> PoolCapacitySlots(const ServiceOptions& options,
                                          const ComputeBackend& backend) {
  if (options.kv_memory_fraction <= 0) return options.kv_capacity_tokens;
  VERIFYD_ASSIGN_OR_RETURN(const int64_t memory, backend.AvailableMemoryBytes());
  const int64_t slot_bytes = int64_t{options.layers} * kKvRowBytes;
  const auto slots = static_cast<int64_t>(options.kv_memory_fraction * static_cast<double>(memory) /
                                          static_cast<double>(slot_bytes));
  if (slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-memory-fraction = ", options.kv_memory_fraction, " of ", memory,
        " bytes holds no slot of ", options.layers, " layers x ", kKvRowBytes, " bytes"));
  }
  // Slots are int32 in the slot tables.
  return std::min<int64_t>(slots, (int64_t{1} << 31) - 1);
}

void FillFragmentation(const FragmentationStats& stats, v1::Fragmentation* out) {
  out->set_sequences(static_cast<uint64_t>(stats.sequences));
  out->set_tokens(static_cast<uint64_t>(stats.tokens));
  out->set_runs(static_cast<uint64_t>(stats.runs));
  out->set_tokens_outside_first_run(static_cast<uint64_t>(stats.tokens_outside_first_run));
  out->set_fragmented_ratio(stats.fragmented_ratio());
}

absl::StatusOr<std::unique_ptr<DeviceOperations>> DeviceOperations::Create(
    const ServiceOptions& options, std::unique_ptr<ComputeBackend> backend,
    ServiceMetrics* metrics) {
  std::unique_ptr<DeviceOperations> ops(new DeviceOperations(options, std::move(backend), metrics));
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
  VERIFYD_ASSIGN_OR_RETURN(const int64_t capacity, PoolCapacitySlots(options, *ops->backend_));
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                           ops->backend_->CreateStorage(options.layers, capacity));
  KvStoreOptions store_options;
  store_options.num_layers = options.layers;
  store_options.max_tree_nodes = options.max_tree_nodes;
  store_options.lease = absl::Seconds(options.lease_seconds);
  ops->store_ = std::make_unique<KvStore>(store_options, std::move(storage));
  ops->RefreshGauges();
  return ops;
}

absl::Status DeviceOperations::Append(const AppendCall& call, v1::AppendResponse* response) {
  const absl::Time start = absl::Now();
  VERIFYD_RETURN_IF_ERROR(RenameFields(
      store_->Append(call.sequence, call.layer_begin, call.layer_count, call.num_tokens, call.kv),
      {{"num_tokens", "kv.shape[1]"}}));
  metrics_->RecordKernel(KernelKind::kAppend, absl::Now() - start);
  VERIFYD_ASSIGN_OR_RETURN(int64_t committed, store_->CommittedLength(call.sequence));
  VERIFYD_ASSIGN_OR_RETURN(std::vector<int64_t> fill, store_->LayerFill(call.sequence));
  response->set_committed_length(static_cast<uint64_t>(committed));
  for (int64_t f : fill) response->add_layer_fill(static_cast<uint64_t>(f));
  return absl::OkStatus();
}

absl::Status DeviceOperations::Verify(const VerifyCall& call, v1::VerifyResponse* response) {
  VERIFYD_RETURN_IF_ERROR(RenameFields(store_->PrepareVerify(call.layer, call.items),
                                       {{"items[", "sequences["},
                                        {"].sequence =", "].sequence_id ="},
                                        {"].commit", "].commit_previous"},
                                        {"items:", "sequences:"}}));
  const int batch = static_cast<int>(call.items.size());
  for (int b = 0; b < batch; ++b) {
    const absl::Status written =
        store_->WriteTreeLayer(call.items[b].sequence, call.layer,
                               call.tree_kv + static_cast<size_t>(call.qo_indptr[b]) * kKvDim);
    if (!written.ok()) return AfterPrepare(written, absl::StrCat("sequences[", b, "] tree KV"));
  }
  prefix_len_.assign(batch, 0);
  slot_indptr_.assign(1, 0);
  mask_indptr_.assign(1, 0);
  slots_.clear();
  slot_lists_.clear();
  mask_bits_.clear();
  // The views' spans stay valid until the next mutating store call, which comes after the compute.
  const bool host_lists = backend_->needs_host_slot_lists();
  for (int b = 0; b < batch; ++b) {
    absl::StatusOr<VerifyView> view = store_->GetVerifyView(call.items[b].sequence);
    if (!view.ok()) return AfterPrepare(view.status(), absl::StrCat("sequences[", b, "] view"));
    prefix_len_[b] = view->prefix_len;
    slot_lists_.push_back(VerifySlotList{call.items[b].sequence, view->slot_generation,
                                         view->prefix_slots, view->tree_slots});
    if (host_lists) {
      slots_.insert(slots_.end(), view->prefix_slots.begin(), view->prefix_slots.end());
      slots_.insert(slots_.end(), view->tree_slots.begin(), view->tree_slots.end());
      slot_indptr_.push_back(static_cast<int32_t>(slots_.size()));
    }
    mask_bits_.insert(mask_bits_.end(), view->mask->bits().begin(), view->mask->bits().end());
    mask_indptr_.push_back(static_cast<int32_t>(mask_bits_.size()));
    response->add_committed_length(static_cast<uint64_t>(view->prefix_len));
    metrics_->RecordTreeNodes(call.qo_indptr[b + 1] - call.qo_indptr[b]);
  }
  metrics_->RecordVerifyBatch(batch);

  const int64_t rows = int64_t{call.total_q} * call.num_heads;
  v1::Tensor* out = response->mutable_out();
  out->set_dtype(v1::DTYPE_BF16);
  out->add_shape(call.total_q);
  out->add_shape(call.num_heads);
  out->add_shape(kVDim);
  bf16_bits* out_data = call.out_destination;
  if (out_data == nullptr) {  // inline; otherwise the service layer names the region in `out`
    std::string* out_bytes = out->mutable_inline_data();
    out_bytes->resize(static_cast<size_t>(rows) * kVDim * sizeof(bf16_bits));
    out_data = reinterpret_cast<bf16_bits*>(out_bytes->data());
  }
  float* lse = nullptr;
  if (call.return_lse) {
    v1::Tensor* lse_tensor = response->mutable_lse();
    lse_tensor->set_dtype(v1::DTYPE_FP32);
    lse_tensor->add_shape(call.total_q);
    lse_tensor->add_shape(call.num_heads);
    lse = call.lse_destination;
    if (lse == nullptr) {
      std::string* lse_bytes = lse_tensor->mutable_inline_data();
      lse_bytes->resize(static_cast<size_t>(rows) * sizeof(float));
      lse = reinterpret_cast<float*>(lse_bytes->data());
    }
  }

  VerifyProblem problem;
  problem.q = call.q;
  problem.out = out_data;
  problem.lse = lse;
  problem.num_heads = call.num_heads;
  problem.scale = call.scale;
  problem.batch = batch;
  problem.total_q = call.total_q;
  problem.qo_indptr = call.qo_indptr.data();
  problem.prefix_len = prefix_len_.data();
  problem.slot_indptr = host_lists ? slot_indptr_.data() : nullptr;
  problem.slots = host_lists ? slots_.data() : nullptr;
  problem.mask_indptr = mask_indptr_.data();
  problem.mask_bits = mask_bits_.data();
  const absl::Time start = absl::Now();
  const absl::Status computed = backend_->ComputeVerify(call.layer, problem, slot_lists_);
  metrics_->RecordKernel(KernelKind::kVerify, absl::Now() - start);
  if (!computed.ok()) return AfterPrepare(computed, "compute");
  return absl::OkStatus();
}

absl::Status DeviceOperations::Commit(const CommitCall& call, v1::CommitResponse* response) {
  VERIFYD_ASSIGN_OR_RETURN(int64_t committed, CommitPlain(call));
  response->set_committed_length(static_cast<uint64_t>(committed));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DeviceOperations::CommitPlain(const CommitCall& call) {
  VERIFYD_RETURN_IF_ERROR(
      RenameFields(store_->Commit(call.sequence, call.path), {{"sequence =", "sequence_id ="}}));
  return store_->CommittedLength(call.sequence);
}

absl::Status DeviceOperations::FailExternal(const ExternalFailure& failure,
                                            const absl::Status& reason) {
  const absl::Status failed = backend_->FailVerifyExternal(failure);
  if (!failed.ok()) {
    return absl::Status(reason.code(), absl::StrCat(reason.message(), " (and the outputs and done "
                                                    "flag could not be written: ",
                                                    failed.ToString(), ")"));
  }
  return reason;
}

absl::Status DeviceOperations::VerifyExternal(const VerifyCall& call, const ExternalOrder& order,
                                              std::vector<int64_t>* committed) {
  const int64_t rows = int64_t{call.total_q} * call.num_heads;
  const ExternalFailure failure{call.out_destination, rows * kVDim, call.lse_destination,
                                call.lse_destination != nullptr ? rows : 0, order};
  const absl::Status prepared =
      RenameFields(store_->PrepareVerify(call.layer, call.items),
                   {{"items[", "sequences["},
                    {"].sequence =", "].sequence_id ="},
                    {"].commit", "].commit_previous"},
                    {"items:", "sequences:"}});
  if (!prepared.ok()) return FailExternal(failure, prepared);
  const int batch = static_cast<int>(call.items.size());
  prefix_len_.assign(batch, 0);
  slot_indptr_.assign(1, 0);
  mask_indptr_.assign(1, 0);
  slots_.clear();
  slot_lists_.clear();
  mask_bits_.clear();
  tree_slots_.clear();
  committed->clear();
  const bool host_lists = backend_->needs_host_slot_lists();
  for (int b = 0; b < batch; ++b) {
    absl::StatusOr<VerifyView> view = store_->GetVerifyView(call.items[b].sequence);
    if (!view.ok()) {
      return FailExternal(failure,
                          AfterPrepare(view.status(), absl::StrCat("sequences[", b, "] view")));
    }
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
    committed->push_back(view->prefix_len);
    metrics_->RecordTreeNodes(call.qo_indptr[b + 1] - call.qo_indptr[b]);
  }
  metrics_->RecordVerifyBatch(batch);

  ExternalVerify external;
  external.layer = call.layer;
  VerifyProblem& problem = external.problem;
  problem.q = call.q;
  problem.out = call.out_destination;
  problem.lse = call.lse_destination;
  problem.num_heads = call.num_heads;
  problem.scale = call.scale;
  problem.batch = batch;
  problem.total_q = call.total_q;
  problem.qo_indptr = call.qo_indptr.data();
  problem.prefix_len = prefix_len_.data();
  problem.slot_indptr = host_lists ? slot_indptr_.data() : nullptr;
  problem.slots = host_lists ? slots_.data() : nullptr;
  problem.mask_indptr = mask_indptr_.data();
  problem.mask_bits = mask_bits_.data();
  external.tree_kv = call.tree_kv;
  external.tree_slots = tree_slots_;
  external.order = order;
  const absl::Time start = absl::Now();
  const absl::Status computed = backend_->ComputeVerifyExternal(external, slot_lists_);
  metrics_->RecordKernel(KernelKind::kVerify, absl::Now() - start);
  // A ready flag that never came is the scheduler's doing, not a defect: its own code. The layer
  // stays unwritten in the store, so a Commit of the tree is refused until it is verified again.
  if (computed.code() == absl::StatusCode::kDeadlineExceeded ||
      computed.code() == absl::StatusCode::kAborted) {
    return computed;
  }
  if (!computed.ok()) return AfterPrepare(computed, "compute");
  // The backend wrote the rows inside the call's order; the store records that this layer of
  // each pending tree is written (so a later Commit accepts it).
  for (int b = 0; b < batch; ++b) {
    const absl::Status marked = store_->MarkTreeLayerWritten(call.items[b].sequence, call.layer);
    if (!marked.ok()) return AfterPrepare(marked, absl::StrCat("sequences[", b, "] tree"));
  }
  return absl::OkStatus();
}

absl::Status DeviceOperations::Release(const ReleaseCall& call, v1::ReleaseResponse* response) {
  const int64_t free_before = store_->Stats().free_slots;
  VERIFYD_RETURN_IF_ERROR(
      RenameFields(store_->Release(call.sequence), {{"sequence =", "sequence_id ="}}));
  backend_->ForgetSequence(call.sequence);
  response->set_freed_slots(static_cast<uint64_t>(store_->Stats().free_slots - free_before));
  return absl::OkStatus();
}

void DeviceOperations::Stats(v1::StatsResponse* response) const {
  const StoreStats stats = store_->Stats();
  response->set_backend(backend_->name());
  response->set_mps_active(backend_->mps_active());
  response->set_layers(static_cast<uint32_t>(options_.layers));
  response->set_heads(static_cast<uint32_t>(options_.heads));
  response->set_max_tree_nodes(static_cast<uint32_t>(options_.max_tree_nodes));
  response->set_capacity_tokens(static_cast<uint64_t>(stats.capacity_slots));
  response->set_used_tokens(static_cast<uint64_t>(stats.used_slots));
  response->set_free_tokens(static_cast<uint64_t>(stats.free_slots));
  response->set_pending_tokens(static_cast<uint64_t>(stats.pending_slots));
  response->set_largest_free_run(static_cast<uint64_t>(stats.largest_free_run));
  FillFragmentation(stats.fragmentation, response->mutable_fragmentation());
  response->set_softmax_scale(options_.softmax_scale);
  metrics_->RecordStore(stats);
}

int64_t DeviceOperations::ExpireLeases() {
  const std::vector<SequenceId> released = store_->ExpireLeases();
  for (SequenceId sequence : released) backend_->ForgetSequence(sequence);
  const int64_t expired = static_cast<int64_t>(released.size());
  if (expired > 0) metrics_->RecordLeaseExpiries(expired);
  return expired;
}

void DeviceOperations::RefreshGauges() const { metrics_->RecordStore(store_->Stats()); }

}  // namespace verifyd
