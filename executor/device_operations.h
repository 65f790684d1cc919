// DeviceOperations: what the executor does for each validated request, on the KvStore and the
// compute backend it owns. Executor thread only (KvStore is not thread-safe).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/compute_backend.h"
#include "backend/external_tensors.h"
#include "executor/device_options.h"
#include "executor/executor_metrics.h"
#include "executor/request_types.h"
#include "kvstore/kv_store.h"

namespace verifyd {

class DeviceOperations {
 public:
  // Creates the backend's storage (options.capacity_slots) and the store over it.
  static absl::StatusOr<std::unique_ptr<DeviceOperations>> Create(
      const DeviceOptions& options, std::unique_ptr<ComputeBackend> backend,
      ExecutorMetrics* metrics);

  absl::StatusOr<AppendResult> Append(const AppendCall& call);
  // PrepareVerify (riding commits, pending trees), tree KV write, one batched compute. out and
  // lse go to the call's destinations, or else into the result's buffers.
  absl::StatusOr<VerifyResult> Verify(const VerifyCall& call);
  // The data plane's Verify (plans/0017): call.q / tree_kv / out_destination / lse_destination
  // point into opened external regions; the backend writes the tree KV and computes inside
  // `order`. Every outcome writes the done flag: a call refused here (by the store) has its
  // outputs NaN-filled through FailExternal first. The result carries each sequence's committed
  // length on success (out and lse went to the destinations: its byte buffers stay empty).
  absl::StatusOr<VerifyResult> VerifyExternal(const VerifyCall& call, const ExternalOrder& order);
  // NaN outputs and the done flag of a call that will not run; returns `reason`.
  absl::Status FailExternal(const ExternalFailure& failure, const absl::Status& reason);
  absl::StatusOr<CommitResult> Commit(const CommitCall& call);
  absl::StatusOr<ReleaseResult> Release(const ReleaseCall& call);
  // The new sequence shares the source's first call.length slots (KvStore::Fork).
  absl::StatusOr<ForkResult> Fork(const ForkCall& call);
  // Also publishes the store's gauges.
  DeviceStats Stats() const;
  // Read-only: renews no lease (KvStore::ListSequences).
  SequencePage ListSequences(const ListSequencesCall& call) const;

  // Releases sequences whose lease passed (and tells the backend to forget them); returns how
  // many.
  int64_t ExpireLeases();
  // Publishes occupancy and fragmentation gauges.
  void RefreshGauges() const;

  KvStore& store() { return *store_; }
  const ComputeBackend& backend() const { return *backend_; }
  // For the external-region table, which opens regions on gRPC threads (compute_backend.h).
  ComputeBackend& mutable_backend() { return *backend_; }

 private:
  DeviceOperations(std::unique_ptr<ComputeBackend> backend, ExecutorMetrics* metrics)
      : backend_(std::move(backend)), metrics_(metrics) {}

  // After PrepareVerify: each item's view into the scratch below (prefix lengths, slot lists,
  // tree slots, host slot arrays when the backend reads them, masks) and result->committed_length.
  // A failure is AfterPrepare's.
  absl::Status GatherViews(const VerifyCall& call, VerifyResult* result);
  // The batch's problem over the gathered scratch; out and lse are the caller's to set.
  VerifyProblem GatheredProblem(const VerifyCall& call) const;
  // The caller's name of Verify's b-th item ("sequences[2]"), for messages.
  std::string Item(int b) const;
  // Before `seq`'s pending tree is committed: the device's answers for its layers written by
  // checked data-plane calls (waiting for them where they are not in yet); a layer whose check
  // said OK is marked written, one it refused stays unwritten, so the store refuses the commit.
  void SettleValueChecks(SequenceId seq);
  void SettleValueChecks(absl::Span<const VerifyItem> items);

  std::unique_ptr<ComputeBackend> backend_;
  std::unique_ptr<KvStore> store_;
  ExecutorMetrics* metrics_;
  // Scratch of Verify, kept to avoid reallocating per call.
  std::vector<int32_t> prefix_len_, slot_indptr_, slots_, mask_indptr_;
  std::vector<VerifySlotList> slot_lists_;
  std::vector<uint64_t> mask_bits_;
  std::vector<int32_t> tree_slots_;
  // Private copies of a shared-memory Verify's q and tree_kv (VerifyCall::inputs_shared).
  std::vector<bf16_bits> q_copy_, tree_kv_copy_;
  // Per sequence, the pending tree's layers last written by a data-plane call whose SPEC §1 check
  // the device answers later (ExternalValueCheck), with that answer: until it is in, the layer
  // is not marked written, so no commit takes rows the check may refuse.
  absl::flat_hash_map<SequenceId, std::vector<std::pair<int, std::shared_ptr<ExternalValueCheck>>>>
      unsettled_;
};

}  // namespace verifyd
