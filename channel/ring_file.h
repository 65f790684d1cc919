// The ring's file: the daemon creates it (shm_open O_CREAT|O_EXCL, mode 0600, pages allocated up
// front, as plans/0010 does for tensor regions, so no client can hand the daemon a file that
// shrinks under it) and the client opens it by name. Header-only (see ring.h).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/shm_file.h"
#include "channel/ring.h"

namespace verifyd::channel {

// A mapping of a ring file; unmaps on destruction (the name is the creator's to unlink).
class RingMapping {
 public:
  RingMapping() = default;
  RingMapping(void* data, uint64_t bytes, uint32_t entries)
      : data_(data), bytes_(bytes), view_(data, entries) {}
  ~RingMapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  RingMapping(const RingMapping&) = delete;
  RingMapping& operator=(const RingMapping&) = delete;
  RingMapping(RingMapping&& o) noexcept { *this = std::move(o); }
  RingMapping& operator=(RingMapping&& o) noexcept {
    if (this != &o) {
      if (data_ != nullptr) munmap(data_, bytes_);
      data_ = o.data_;
      bytes_ = o.bytes_;
      view_ = o.view_;
      o.data_ = nullptr;
    }
    return *this;
  }
  const RingView& view() const { return view_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
  RingView view_;
};

// Daemon: a fresh ring under the POSIX shared-memory name `name` ("/verifyd-channel-<hex>").
inline absl::StatusOr<RingMapping> CreateRingFile(const std::string& name, uint32_t entries) {
  if (!ValidEntries(entries)) {
    return absl::InvalidArgumentError(absl::StrCat("entries = ", entries,
                                                   " must be a power of two in [", kMinEntries,
                                                   ", ", kMaxEntries, "]"));
  }
  const uint64_t bytes = RingFileBytes(entries);
  absl::StatusOr<void*> data = CreateSharedMemoryFile(name, bytes, "a channel");
  if (!data.ok()) return data.status();
  RingMapping mapping(*data, bytes, entries);
  mapping.view().Initialize();
  return mapping;
}

// Client: maps the ring the daemon created; FAILED_PRECONDITION when it is not a ring of this
// version and size.
inline absl::StatusOr<RingMapping> OpenRingFile(const std::string& name, uint32_t entries) {
  if (!ValidEntries(entries)) {
    return absl::InvalidArgumentError(absl::StrCat("entries = ", entries, " is not a ring size"));
  }
  const uint64_t bytes = RingFileBytes(entries);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shm_open '", name, "': ", std::strerror(errno),
        " (the channel's client must run on the daemon's host, as the daemon's user)"));
  }
  struct stat st {};
  void* data = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= bytes) {
    data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (data == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map the ", bytes, " bytes of channel '", name, "'"));
  }
  RingMapping mapping(data, bytes, entries);
  if (!mapping.view().HeaderMatches()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", name, "' is not a version ", kRingVersion, " ring of ", entries, " entries"));
  }
  return mapping;
}

}  // namespace verifyd::channel
