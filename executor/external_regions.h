// ExternalRegionTable: memory schedulers registered with the daemon (RegisterExternalMemory,
// plans/0017-data-plane.md), opened through the backend (CUDA IPC handles; files on the cpu
// backend). Each region belongs to the client that registered it: only that client may name it
// (in a channel's descriptors, in Append) or release it. A region no call named for the lease is
// released, like the shared-memory regions of plans/0010. Thread-safe: gRPC threads register and
// release, channel threads resolve, the executor's tick expires; a call pins the regions it names
// (shared_ptr), so a region released meanwhile stays open until the call has finished.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backend/compute_backend.h"
#include "base/descriptor_budget.h"

namespace verifyd {

struct ExternalRegionLimits {
  int device = 0;  // the daemon's device: a registration names it
  // Daemon-wide, whoever asks (a client names itself: a per-client bound bounds nothing; issue 33
  // N6).
  int max_regions = 256;
  // The process's descriptors (opening a region takes one for a moment). Null: not checked.
  DescriptorBudget* descriptors = nullptr;
  uint64_t max_region_bytes = uint64_t{1} << 40;
  absl::Duration lease = absl::Seconds(300);
};

// One open region; closed when the table and every call let go.
class OpenExternalRegion {
 public:
  OpenExternalRegion(uint64_t id, std::string owner, std::unique_ptr<ExternalRegion> region)
      : id_(id), owner_(std::move(owner)), region_(std::move(region)) {}
  uint64_t id() const { return id_; }
  const std::string& owner() const { return owner_; }
  uint8_t* data() const { return static_cast<uint8_t*>(region_->data()); }
  uint64_t bytes() const { return region_->bytes(); }

 private:
  uint64_t id_;
  std::string owner_;
  std::unique_ptr<ExternalRegion> region_;
};
using ExternalPins = std::vector<std::shared_ptr<const OpenExternalRegion>>;

class ExternalRegionTable {
 public:
  using Clock = std::function<absl::Time()>;
  ExternalRegionTable(
      ComputeBackend* backend, ExternalRegionLimits limits,
      Clock clock = [] { return absl::Now(); });

  // Validates (device, bytes, the handle opens, the memory 256-byte aligned, the client's count)
  // and opens the region. INVALID_ARGUMENT / NOT_FOUND naming the field; UNIMPLEMENTED when the
  // backend has no external memory; RESOURCE_EXHAUSTED past max_regions or the descriptor budget.
  absl::StatusOr<uint64_t> Register(const std::string& owner, const ExternalMemoryHandle& handle);
  // NOT_FOUND when unknown, PERMISSION_DENIED when another client's. Returns its bytes.
  absl::StatusOr<uint64_t> Release(const std::string& owner, uint64_t region);
  // The region, its lease renewed: `field` names the reference ("q.region"). NOT_FOUND when
  // unknown or expired, PERMISSION_DENIED when another client's.
  absl::StatusOr<std::shared_ptr<const OpenExternalRegion>> Find(const std::string& owner,
                                                                 uint64_t region,
                                                                 const std::string& field);
  // Resolves [offset, offset + length) of a region for `field`: offset a multiple of `align`,
  // the range inside the region. Appends the region to `pins`.
  absl::StatusOr<uint8_t*> Resolve(const std::string& owner, uint64_t region, uint64_t offset,
                                   uint64_t length, uint64_t align, const std::string& field,
                                   ExternalPins* pins);
  // Releases every region whose lease passed; returns how many.
  int ExpireIdle();
  // Shutdown: drops every region (calls holding pins keep theirs).
  void ReleaseAll();

  // Whether regions are host memory (ComputeBackend::external_memory_is_host).
  bool host_memory() const { return backend_->external_memory_is_host(); }
  int regions() const;
  uint64_t total_bytes() const;

 private:
  struct Entry {
    std::shared_ptr<const OpenExternalRegion> region;
    absl::Time last_used;
  };
  ComputeBackend* backend_;
  const ExternalRegionLimits limits_;
  const Clock clock_;
  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  int opening_ = 0;  // registrations between their check and their entry
  uint64_t total_bytes_ = 0;
};

}  // namespace verifyd
