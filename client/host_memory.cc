#include "client/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/sealed_memfd.h"

namespace verifyd {

absl::StatusOr<HostMemory> HostMemory::Create(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("bytes = 0 must be >= 1");
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  bytes = (bytes + page - 1) / page * page;
  absl::StatusOr<int> fd = CreateSealedMemfd("verifyd-host-memory", bytes);
  if (!fd.ok()) return fd.status();
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    close(*fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", bytes, " bytes: ", std::strerror(err)));
  }
  HostMemory memory;
  memory.fd_ = *fd;
  memory.data_ = static_cast<uint8_t*>(data);
  memory.bytes_ = bytes;
  return memory;
}

HostMemory::HostMemory(HostMemory&& other) noexcept { *this = std::move(other); }

HostMemory& HostMemory::operator=(HostMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = other.fd_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.fd_ = -1;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

HostMemory::~HostMemory() { Reset(); }

std::string HostMemory::handle() const { return fd_ >= 0 ? MemfdHandle(fd_) : ""; }

void HostMemory::Reset() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  fd_ = -1;
  bytes_ = 0;
}

}  // namespace verifyd
