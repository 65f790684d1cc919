#include "backend/cpu/cpu_backend.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_external.h"
#include "kvstore/kv_storage.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"
#include "verify/verify_reference.h"

namespace verifyd {

absl::StatusOr<std::unique_ptr<KvStorage>> CpuBackend::CreateStorage(int num_layers,
                                                                     int64_t capacity_slots,
                                                                     KvDtype dtype) {
  if (storage_ != nullptr) return absl::FailedPreconditionError("CpuBackend storage exists");
  auto storage = std::make_unique<HostKvStorage>(num_layers, capacity_slots, dtype);
  storage_ = storage.get();
  return std::unique_ptr<KvStorage>(std::move(storage));
}

absl::Status CpuBackend::ComputeVerify(int layer, VerifyProblem problem,
                                       absl::Span<const VerifySlotList> slot_lists) {
  (void)slot_lists;
  if (storage_ == nullptr) return absl::FailedPreconditionError("CpuBackend has no storage");
  if (layer < 0 || layer >= storage_->num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer = ", layer, " must be < ", storage_->num_layers()));
  }
  if (storage_->dtype() == KvDtype::kFp8) {
    problem.kv = nullptr;
    problem.kv_fp8 = storage_->layer_bytes(layer);
  } else {
    problem.kv = storage_->layer_data(layer);
  }
  problem.num_slots = storage_->capacity_slots();
  return ComputeVerifyReference(problem, num_threads_);
}

absl::StatusOr<std::unique_ptr<ExternalRegion>> CpuBackend::OpenExternalRegion(
    const ExternalMemoryHandle& handle) {
  return OpenCpuExternalRegion(handle);
}

absl::Status CpuBackend::ComputeVerifyExternal(const ExternalVerify& call,
                                               absl::Span<const VerifySlotList> slot_lists) {
  const VerifyProblem& p = call.problem;
  const int64_t rows = int64_t{p.total_q} * p.num_heads;
  ExternalFailure failure{p.out, p.out != nullptr ? rows * kVDim : 0, p.lse,
                          p.lse != nullptr ? rows : 0, ExternalOrder{}};
  absl::Status status = WaitReadyFlag(call.order.ready, ready_timeout_, call.order.cancelled);
  if (status.ok() && storage_ == nullptr) {
    status = absl::FailedPreconditionError("CpuBackend has no storage");
  }
  if (status.ok() && (call.tree_kv == nullptr || p.q == nullptr)) {
    status = absl::InvalidArgumentError("q and tree_kv must not be null");
  }
  if (status.ok() && static_cast<int64_t>(call.tree_slots.size()) != p.total_q) {
    status = absl::InvalidArgumentError(absl::StrCat("tree_slots has ", call.tree_slots.size(),
                                                     " slots, must equal total_q = ", p.total_q));
  }
  // SPEC §1 on the scheduler's tensors, once they are ready and before any of them is kept: the
  // gRPC path's check and message (verify/value_bound.h), on private copies that are then all
  // the call reads, since the scheduler may rewrite its region meanwhile (issue 33 N8).
  VerifyProblem computed = p;
  if (status.ok()) {
    const int64_t q_shape[] = {p.total_q, p.num_heads, kKvDim};
    q_copy_.resize(static_cast<size_t>(p.total_q) * p.num_heads * kKvDim);
    status = CopyCheckingValueBound(q_copy_.data(), p.q, q_shape, "q");
    computed.q = q_copy_.data();
  }
  if (status.ok()) {
    const int64_t kv_shape[] = {p.total_q, kKvDim};
    tree_kv_copy_.resize(static_cast<size_t>(p.total_q) * kKvDim);
    status = CopyCheckingValueBound(tree_kv_copy_.data(), call.tree_kv, kv_shape, "tree_kv");
  }
  if (status.ok()) status = storage_->WriteRows(call.layer, call.tree_slots, tree_kv_copy_.data());
  if (status.ok()) status = ComputeVerify(call.layer, computed, slot_lists);
  if (!status.ok()) FillOutputsWithNan(failure);
  WriteDoneFlag(call.order.done);
  return status;
}

absl::Status CpuBackend::FailVerifyExternal(const ExternalFailure& failure) {
  // The outputs are the scheduler's until its ready flag: a NaN written earlier could land under
  // a kernel of its own still reading the previous layer's out. A ready flag that never comes
  // still ends (the bounded wait), and the fill and the flag happen anyway.
  const absl::Status waited =
      WaitReadyFlag(failure.order.ready, ready_timeout_, failure.order.cancelled);
  FillOutputsWithNan(failure);
  WriteDoneFlag(failure.order.done);
  return waited;
}

absl::Status CpuBackend::WaitReadyOnHost(const ExternalFlag& ready,
                                         const std::atomic<bool>* cancelled) const {
  return WaitReadyFlag(ready, ready_timeout_, cancelled);
}

absl::StatusOr<int64_t> CpuBackend::AvailableMemoryBytes() const {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0) {
    return absl::UnavailableError("sysconf cannot tell this host's physical memory");
  }
  return int64_t{pages} * page_bytes;
}

}  // namespace verifyd
