// The CPU backend: the reference arithmetic (fp32 accumulation) directly on host KV rows.
#pragma once

#include "backend/compute_backend.h"

namespace verifyd {

class HostKvStorage;

class CpuBackend : public ComputeBackend {
 public:
  // num_threads <= 0: every core.
  explicit CpuBackend(int num_threads) : num_threads_(num_threads) {}
  const char* name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int num_layers,
                                                           int64_t capacity_slots) override;
  // Reads the concatenated host slot arrays (needs_host_slot_lists()); `slot_lists` is ignored.
  using ComputeBackend::ComputeVerify;
  absl::Status ComputeVerify(int layer, VerifyProblem problem,
                             absl::Span<const VerifySlotList> slot_lists) override;
  // Physical memory of the host.
  absl::StatusOr<int64_t> AvailableMemoryBytes() const override;

 private:
  int num_threads_;
  // Owned by the KvStore, which outlives the executor's use of this backend.
  HostKvStorage* storage_ = nullptr;
};

}  // namespace verifyd
