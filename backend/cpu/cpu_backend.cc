#include "backend/cpu/cpu_backend.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "verify/verify_reference.h"
#include "kvstore/kv_storage.h"

namespace verifyd {

absl::StatusOr<std::unique_ptr<KvStorage>> CpuBackend::CreateStorage(int num_layers,
                                                                     int64_t capacity_slots) {
  if (storage_ != nullptr) return absl::FailedPreconditionError("CpuBackend storage exists");
  auto storage = std::make_unique<HostKvStorage>(num_layers, capacity_slots);
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
  problem.kv = storage_->layer_data(layer);
  problem.num_slots = storage_->capacity_slots();
  return ComputeVerifyReference(problem, num_threads_);
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
