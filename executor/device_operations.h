// DeviceOperations: what the executor does for each validated request, on the KvStore and the
// compute backend it owns. Executor thread only (KvStore is not thread-safe).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/kv_store.h"
#include "backend/compute_backend.h"
#include "backend/external_tensors.h"
#include "executor/request_types.h"
#include "service/service_metrics.h"
#include "service/service_options.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd {

class DeviceOperations {
 public:
  // Creates the backend's storage and the store over it.
  static absl::StatusOr<std::unique_ptr<DeviceOperations>> Create(
      const ServiceOptions& options, std::unique_ptr<ComputeBackend> backend,
      ServiceMetrics* metrics);

  absl::Status Append(const AppendCall& call, v1::AppendResponse* response);
  // PrepareVerify (riding commits, pending trees), tree KV write, one batched compute.
  absl::Status Verify(const VerifyCall& call, v1::VerifyResponse* response);
  // The data plane's Verify (plans/0017): call.q / tree_kv / out_destination / lse_destination
  // point into opened external regions; the backend writes the tree KV and computes inside
  // `order`. Every outcome writes the done flag: a call refused here (by the store) has its
  // outputs NaN-filled through FailExternal first. *committed gets each sequence's committed
  // length on success.
  absl::Status VerifyExternal(const VerifyCall& call, const ExternalOrder& order,
                              std::vector<int64_t>* committed);
  // NaN outputs and the done flag of a call that will not run; returns `reason`.
  absl::Status FailExternal(const ExternalFailure& failure, const absl::Status& reason);
  absl::Status Commit(const CommitCall& call, v1::CommitResponse* response);
  // Commit without protobuf (the channel): returns the committed length.
  absl::StatusOr<int64_t> CommitPlain(const CommitCall& call);
  absl::Status Release(const ReleaseCall& call, v1::ReleaseResponse* response);
  void Stats(v1::StatsResponse* response) const;

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
  DeviceOperations(const ServiceOptions& options, std::unique_ptr<ComputeBackend> backend,
                   ServiceMetrics* metrics)
      : options_(options), backend_(std::move(backend)), metrics_(metrics) {}

  ServiceOptions options_;
  std::unique_ptr<ComputeBackend> backend_;
  std::unique_ptr<KvStore> store_;
  ServiceMetrics* metrics_;
  // Scratch of Verify, kept to avoid reallocating per call.
  std::vector<int32_t> prefix_len_, slot_indptr_, slots_, mask_indptr_;
  std::vector<VerifySlotList> slot_lists_;
  std::vector<uint64_t> mask_bits_;
  std::vector<int32_t> tree_slots_;
};

// The pool's capacity in slots: --kv-capacity-tokens, or --kv-memory-fraction of what the backend
// reports (AvailableMemoryBytes) divided by one slot's bytes over all layers, at most 2^31 - 1.
absl::StatusOr<int64_t> PoolCapacitySlots(const ServiceOptions& options,
                                          const ComputeBackend& backend);
void FillFragmentation(const FragmentationStats& stats, v1::Fragmentation* out);

}  // namespace verifyd
