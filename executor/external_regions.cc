#include "executor/external_regions.h"

#include "absl/strings/str_cat.h"
#include "base/align.h"
#include "base/random.h"

namespace verifyd {
ExternalRegionTable::ExternalRegionTable(ComputeBackend* backend, ExternalRegionLimits limits,
                                         Clock clock)
    : backend_(backend), limits_(limits), clock_(std::move(clock)) {}

absl::StatusOr<uint64_t> ExternalRegionTable::Register(const std::string& owner,
                                                       const ExternalMemoryHandle& handle) {
  if (handle.device != limits_.device) {
    return absl::InvalidArgumentError(
        absl::StrCat("device = ", handle.device,
                     " must be this daemon's device (--device = ", limits_.device, ")"));
  }
  if (handle.bytes == 0 || handle.bytes > limits_.max_region_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes = ", handle.bytes, " must be in [1, ", limits_.max_region_bytes, "]"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int held = static_cast<int>(entries_.size()) + opening_;
    if (held >= limits_.max_regions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the daemon has ", held,
                       " registered external regions, the most allowed (--max-external-regions = ",
                       limits_.max_regions, "); release one first"));
    }
    if (limits_.descriptors != nullptr && !limits_.descriptors->HasRoom(1)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon has about ", limits_.descriptors->counted(), " of its ",
          limits_.descriptors->limit(), " descriptors open and keeps ",
          limits_.descriptors->reserve(), " free for new connections; release regions first"));
    }
    ++opening_;
  }
  absl::StatusOr<std::unique_ptr<ExternalRegion>> opened = backend_->OpenExternalRegion(handle);
  auto opened_done = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    --opening_;
  };
  if (!opened.ok()) {
    opened_done();
    return opened.status();
  }
  if (reinterpret_cast<uintptr_t>((*opened)->data()) % kDeviceAlignment != 0) {
    opened_done();
    return absl::InvalidArgumentError(
        "handle: the memory does not start at a 256-byte boundary; register the allocation's "
        "base");
  }
  const uint64_t bytes = (*opened)->bytes();
  std::lock_guard<std::mutex> lock(mu_);
  --opening_;
  // Random and never 0 (0 means "no region" in a descriptor): a stale id from another client or
  // an earlier daemon does not name someone else's region by accident.
  uint64_t id = RandomNonzeroId();
  while (entries_.contains(id)) id = RandomNonzeroId();
  entries_[id] =
      Entry{std::make_shared<const OpenExternalRegion>(id, owner, *std::move(opened)), clock_()};
  total_bytes_ += bytes;
  return id;
}

absl::StatusOr<uint64_t> ExternalRegionTable::Release(const std::string& owner, uint64_t region) {
  std::shared_ptr<const OpenExternalRegion> dropped;  // closed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(region);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("region = ", region, " is not registered"));
  }
  if (it->second.region->owner() != owner) {
    return absl::PermissionDeniedError(
        absl::StrCat("region = ", region, " belongs to another client"));
  }
  dropped = std::move(it->second.region);
  entries_.erase(it);
  total_bytes_ -= dropped->bytes();
  return dropped->bytes();
}

absl::StatusOr<std::shared_ptr<const OpenExternalRegion>> ExternalRegionTable::Find(
    const std::string& owner, uint64_t region, const std::string& field) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(region);
  const absl::Time now = clock_();
  if (it == entries_.end() || now - it->second.last_used > limits_.lease) {
    return absl::NotFoundError(absl::StrCat(field, " = ", region,
                                            " is not a registered external region (released, "
                                            "expired, or never registered)"));
  }
  if (it->second.region->owner() != owner) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, " = ", region, " belongs to another client"));
  }
  it->second.last_used = now;
  return it->second.region;
}

absl::StatusOr<uint8_t*> ExternalRegionTable::Resolve(const std::string& owner, uint64_t region,
                                                      uint64_t offset, uint64_t length,
                                                      uint64_t align, const std::string& field,
                                                      ExternalPins* pins) {
  const std::string prefix = field.empty() ? "" : absl::StrCat(field, ".");
  if (region == 0) return absl::InvalidArgumentError(absl::StrCat(prefix, "region must be set"));
  absl::StatusOr<std::shared_ptr<const OpenExternalRegion>> found =
      Find(owner, region, absl::StrCat(prefix, "region"));
  if (!found.ok()) return found.status();
  const OpenExternalRegion& r = **found;
  if (offset % align != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "offset = ", offset, " must be a multiple of ", align));
  }
  if (offset > r.bytes() || length > r.bytes() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "offset = ", offset, " + ", length,
                                                   " bytes must be <= the ", r.bytes(),
                                                   " bytes of region ", region));
  }
  uint8_t* data = r.data() + offset;
  if (pins != nullptr) pins->push_back(*std::move(found));
  return data;
}

int ExternalRegionTable::ExpireIdle() {
  std::vector<std::shared_ptr<const OpenExternalRegion>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = clock_();
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (now - it->second.last_used > limits_.lease) {
        total_bytes_ -= it->second.region->bytes();
        dropped.push_back(std::move(it->second.region));
        entries_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  return static_cast<int>(dropped.size());
}

void ExternalRegionTable::ReleaseAll() {
  absl::flat_hash_map<uint64_t, Entry> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  dropped.swap(entries_);
  total_bytes_ = 0;
}

int ExternalRegionTable::regions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(entries_.size());
}

uint64_t ExternalRegionTable::total_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_bytes_;
}

}  // namespace verifyd
