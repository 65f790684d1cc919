// The ring's file: the daemon creates it (shm_open O_CREAT|O_EXCL, mode 0600, pages allocated up
// front, as plans/0010 does for tensor regions, so no client can hand the daemon a file that
// shrinks under it) and the client opens it by name. Header-only (see ring.h).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
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

// A mapping of a ring file; unmaps on destruction (the name is the creator's to unlink). It keeps
// a descriptor of the file open as well: the client's holds a shared flock(2) while its process
// lives, and the daemon's tests for it (ClientGone).
class RingMapping {
 public:
  RingMapping() = default;
  RingMapping(void* data, uint64_t bytes, uint32_t entries, int fd = -1)
      : data_(data), bytes_(bytes), view_(data, entries), fd_(fd) {}
  ~RingMapping() { Reset(); }
  RingMapping(const RingMapping&) = delete;
  RingMapping& operator=(const RingMapping&) = delete;
  RingMapping(RingMapping&& o) noexcept { *this = std::move(o); }
  RingMapping& operator=(RingMapping&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = o.data_;
      bytes_ = o.bytes_;
      view_ = o.view_;
      fd_ = o.fd_;
      o.data_ = nullptr;
      o.fd_ = -1;
    }
    return *this;
  }
  const RingView& view() const { return view_; }
  uint64_t bytes() const { return bytes_; }

  // Daemon: true once an attached client's process has ended (nothing holds its shared lock any
  // more); false while it lives and for a client that never attached (the lease decides then).
  // A forked child inherits the lock with the descriptor: the channel lives while either does.
  bool ClientGone() const {
    if (fd_ < 0 || view_.header().client_attached.load(std::memory_order_acquire) == 0) {
      return false;
    }
    if (flock(fd_, LOCK_EX | LOCK_NB) != 0) return false;
    flock(fd_, LOCK_UN);
    return true;
  }

 private:
  void Reset() {
    if (data_ != nullptr) munmap(data_, bytes_);
    if (fd_ >= 0) close(fd_);
    data_ = nullptr;
    fd_ = -1;
  }

  void* data_ = nullptr;
  uint64_t bytes_ = 0;
  RingView view_;
  int fd_ = -1;
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
  // The daemon's own descriptor, for ClientGone's test of the client's lock.
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    munmap(*data, bytes);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("opening the channel's ring for its lock: ", std::strerror(err)));
  }
  RingMapping mapping(*data, bytes, entries, fd);
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
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
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
  if (data == MAP_FAILED) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map the ", bytes, " bytes of channel '", name, "'"));
  }
  RingMapping mapping(data, bytes, entries, fd);
  if (!mapping.view().HeaderMatches()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", name, "' is not a version ", kRingVersion, " ring of ", entries, " entries"));
  }
  // Held until this mapping's descriptor closes (the process's end at the latest): the daemon
  // tests it to close the channel of a client that died (RingMapping::ClientGone).
  if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
    mapping.view().header().client_attached.store(1, std::memory_order_release);
  }
  return mapping;
}

}  // namespace verifyd::channel
