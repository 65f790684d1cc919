// verifyd::SharedMemoryRegion: a shared-memory region the daemon created for tensors
// (plans/0010-shared-memory-tensors.md), mapped into this process. Made by
// Client::CreateSharedMemory. Tensors placed in it travel as a SharedMemoryRef instead of inline
// protobuf bytes, and the daemon can write Verify's out/lse into it.
//
// Movable, not copyable. The destructor (or Release) tells the daemon to drop the region, then
// unmaps it; the Client that made it must outlive it. The daemon also drops a region no request
// named for its --lease-seconds: this mapping stays valid then, but the daemon no longer knows the
// name (NOT_FOUND). One region serves one call at a time: the daemon reads inputs and writes
// outputs in place while the call runs.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd {

class Client;

// Offsets of tensors in a region must be multiples of this.
inline constexpr uint64_t kSharedMemoryAlignment = 64;
inline uint64_t AlignSharedOffset(uint64_t offset) {
  return (offset + kSharedMemoryAlignment - 1) / kSharedMemoryAlignment * kSharedMemoryAlignment;
}

class SharedMemoryRegion {
 public:
  SharedMemoryRegion() = default;
  SharedMemoryRegion(SharedMemoryRegion&& other) noexcept;
  SharedMemoryRegion& operator=(SharedMemoryRegion&& other) noexcept;
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;
  ~SharedMemoryRegion();  // Release(), errors ignored

  // Maps a region the daemon described (Client::CreateSharedMemory calls this). `owner` gets the
  // ReleaseSharedMemory call; null: only unmapped on release.
  static absl::StatusOr<SharedMemoryRegion> Map(Client* owner, const v1::SharedMemoryRegion& info);

  bool mapped() const { return data_ != nullptr; }
  // The name requests use in SharedMemoryRef.region.
  const std::string& region() const { return region_; }
  uint64_t size() const { return size_; }
  absl::Span<uint8_t> bytes() { return {data_, static_cast<size_t>(size_)}; }
  absl::Span<const uint8_t> bytes() const { return {data_, static_cast<size_t>(size_)}; }

  // A ref to [offset, offset + length); INVALID_ARGUMENT when misaligned or outside the region.
  absl::StatusOr<v1::SharedMemoryRef> Ref(uint64_t offset, uint64_t length) const;
  // The bytes a ref of this region names (checked as Ref does, and that it names this region).
  absl::StatusOr<absl::Span<const uint8_t>> View(const v1::SharedMemoryRef& ref,
                                                 const std::string& field) const;

  // Tells the daemon (ReleaseSharedMemory), then unmaps. The region is unmapped even when the
  // call fails (the daemon's lease drops it then).
  absl::Status Release();

 private:
  SharedMemoryRegion(Client* owner, std::string region, uint8_t* data, uint64_t size)
      : owner_(owner), region_(std::move(region)), data_(data), size_(size) {}
  void Unmap();

  Client* owner_ = nullptr;
  std::string region_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace verifyd
