// A fresh POSIX shared-memory file made by the daemon: shm_open O_CREAT|O_EXCL, mode 0600 whatever
// the umask, sized, its pages allocated up front (posix_fallocate: a full /dev/shm is an error
// here, not a SIGBUS when the daemon later writes into it), mapped read-write. The tensor regions
// (service/shared_memory_registry) and the channel rings (channel/ring_file.h) are both made so.
// Header-only: the channel's wire format is header-only too.
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

// Maps `bytes` of a new file `name`; on failure nothing is left behind (the name is unlinked).
// `what` names the memory in messages ("a channel", "shared memory").
inline absl::StatusOr<void*> CreateSharedMemoryFile(const std::string& name, uint64_t bytes,
                                                    const std::string& what) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    const int err = errno;
    const std::string why = absl::StrCat("shm_open '", name, "': ", std::strerror(err));
    // Out of descriptors or of /dev/shm: the daemon holds too much, not a defect (issue 33 N6).
    if (err == EMFILE || err == ENFILE || err == ENOSPC || err == ENOMEM) {
      return absl::ResourceExhaustedError(why);
    }
    return absl::InternalError(why);
  }
  absl::Status status;
  void* data = MAP_FAILED;
  if (fchmod(fd, 0600) != 0) {  // the mode survives any umask, and nothing wider
    status = absl::InternalError(absl::StrCat("fchmod '", name, "': ", std::strerror(errno)));
  } else if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    status = absl::ResourceExhaustedError(
        absl::StrCat("ftruncate '", name, "' to ", bytes, " bytes: ", std::strerror(errno)));
  } else if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    status = absl::ResourceExhaustedError(
        absl::StrCat("allocating the ", bytes, " bytes of ", what, ": ", std::strerror(err)));
  } else {
    data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("mmap of ", bytes, " bytes: ", std::strerror(errno)));
    }
  }
  close(fd);
  if (!status.ok()) {
    shm_unlink(name.c_str());
    return status;
  }
  return data;
}

}  // namespace verifyd
