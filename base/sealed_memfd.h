// Memory a scheduler hands a cpu-backend daemon (RegisterExternalMemory, plans/0017): an anonymous
// memfd whose pages are allocated up front and which is sealed so that it can never shrink (nor
// grow): F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL. The daemon maps it through
// /proc/<pid>/fd/<n> and may then read and write it without ever meeting a missing page (a file
// truncated under its mapping was a SIGBUS, issue 33 N3), and it maps nothing else (any file its
// user can open was writable that way, N5). Header-only: the client library makes these, the
// cpu backend checks them.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace verifyd {

inline constexpr int kMemfdSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// A new sealed memfd of `bytes` (its descriptor, close-on-exec); `name` shows in /proc/<pid>/maps.
inline absl::StatusOr<int> CreateSealedMemfd(const char* name, uint64_t bytes) {
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  absl::Status status;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    status = absl::ResourceExhaustedError(
        absl::StrCat("sizing a memfd to ", bytes, " bytes: ", std::strerror(errno)));
  } else if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    status = absl::ResourceExhaustedError(
        absl::StrCat("allocating the ", bytes, " bytes of a memfd: ", std::strerror(err)));
  } else if (fcntl(fd, F_ADD_SEALS, kMemfdSeals) != 0) {
    status = absl::InternalError(absl::StrCat("sealing a memfd: ", std::strerror(errno)));
  }
  if (!status.ok()) {
    close(fd);
    return status;
  }
  return fd;
}

// What RegisterExternalMemory's handle names on the cpu backend: the descriptor of this process.
inline std::string MemfdHandle(int fd) { return absl::StrCat("/proc/", getpid(), "/fd/", fd); }

// The daemon's check of an opened handle: a regular file that cannot shrink (F_SEAL_SHRINK), with
// at least `bytes` bytes, all allocated. INVALID_ARGUMENT naming `path` and what is missing.
inline absl::Status CheckSealedMemfd(int fd, const std::string& path, uint64_t bytes) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("handle: '", path, "' is not a regular file"));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handle: '", path,
        "' is not a memfd sealed against shrinking; the cpu backend maps only memory that "
        "cannot shrink under it (memfd_create with MFD_ALLOW_SEALING, posix_fallocate, "
        "F_ADD_SEALS F_SEAL_SHRINK; client/host_memory.h makes one)"));
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes = ", bytes, " must be <= the ", st.st_size, " bytes of '", path, "'"));
  }
  // A hole would be filled when the daemon first writes there, which can fail (a hugetlb memfd
  // without pages left): SIGBUS again.
  if (static_cast<uint64_t>(st.st_blocks) * 512 < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handle: '", path, "' has ", static_cast<uint64_t>(st.st_blocks) * 512, " of its ", bytes,
        " bytes allocated; allocate them (posix_fallocate) before registering"));
  }
  return absl::OkStatus();
}

}  // namespace verifyd
