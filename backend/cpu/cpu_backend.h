// The CPU backend: the reference arithmetic (fp32 accumulation) directly on host KV rows.
#pragma once

#include <vector>

#include "absl/time/time.h"
#include "backend/compute_backend.h"

namespace verifyd {

class HostKvStorage;

class CpuBackend : public ComputeBackend {
 public:
  // num_threads <= 0: every core. ready_timeout bounds the wait for an external call's ready flag
  // (cpu_external.h): the wait holds a thread (the channel's, WaitReadyOnHost), so it must end.
  explicit CpuBackend(int num_threads, absl::Duration ready_timeout = absl::Seconds(10))
      : num_threads_(num_threads), ready_timeout_(ready_timeout) {}
  const char* name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int num_layers,
                                                           int64_t capacity_slots) override {
    return CreateStorage(num_layers, capacity_slots, KvDtype::kBf16);
  }
  // Either dtype: the reference dequantizes fp8 rows as it reads them.
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int num_layers, int64_t capacity_slots,
                                                           KvDtype dtype) override;
  // Reads the concatenated host slot arrays (needs_host_slot_lists()); `slot_lists` is ignored.
  using ComputeBackend::ComputeVerify;
  absl::Status ComputeVerify(int layer, VerifyProblem problem,
                             absl::Span<const VerifySlotList> slot_lists) override;
  // Physical memory of the host.
  absl::StatusOr<int64_t> AvailableMemoryBytes() const override;

  // The data plane on host memory (cpu_external.h): a region is a mapped file; the ready wait is
  // bounded by ready_timeout (DEADLINE_EXCEEDED, outputs NaN, done written).
  absl::StatusOr<std::unique_ptr<ExternalRegion>> OpenExternalRegion(
      const ExternalMemoryHandle& handle) override;
  absl::Status ComputeVerifyExternal(const ExternalVerify& call,
                                     absl::Span<const VerifySlotList> slot_lists) override;
  absl::Status FailVerifyExternal(const ExternalFailure& failure) override;
  bool external_memory_is_host() const override { return true; }
  bool waits_for_ready_on_host() const override { return true; }
  absl::Status WaitReadyOnHost(const ExternalFlag& ready,
                               const std::atomic<bool>* cancelled) const override;

 private:
  int num_threads_;
  absl::Duration ready_timeout_;
  // Owned by the KvStore, which outlives the executor's use of this backend.
  HostKvStorage* storage_ = nullptr;
  // An external call's q and tree_kv, copied out of the scheduler's region (executor thread).
  std::vector<bf16_bits> q_copy_, tree_kv_copy_;
};

}  // namespace verifyd
