#include "client/shared_memory_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/client.h"

namespace verifyd {

SharedMemoryRegion::SharedMemoryRegion(SharedMemoryRegion&& other) noexcept
    : owner_(other.owner_),
      region_(std::move(other.region_)),
      data_(other.data_),
      size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.owner_ = nullptr;
}

SharedMemoryRegion& SharedMemoryRegion::operator=(SharedMemoryRegion&& other) noexcept {
  if (this != &other) {
    (void)Release();
    owner_ = other.owner_;
    region_ = std::move(other.region_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.owner_ = nullptr;
  }
  return *this;
}

SharedMemoryRegion::~SharedMemoryRegion() { (void)Release(); }

absl::StatusOr<SharedMemoryRegion> SharedMemoryRegion::Map(Client* owner,
                                                           const v1::SharedMemoryRegion& info) {
  if (info.bytes() == 0 || info.path().empty() || info.region().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("region '", info.region(), "' path '", info.path(), "' of ", info.bytes(),
                     " bytes: region, path and bytes must all be set"));
  }
  const int fd = shm_open(info.path().c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::Status(
        errno == EACCES ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kNotFound,
        absl::StrCat("shm_open '", info.path(), "': ", std::strerror(errno),
                     " (the client must run as the daemon's user on the same host)"));
  }
  // Mapping past the end of the file would SIGBUS on first touch.
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < info.bytes()) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("shared memory '", info.path(),
                                                      "' is smaller than the ", info.bytes(),
                                                      " bytes announced"));
  }
  void* data = mmap(nullptr, info.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("mmap of ", info.bytes(), " bytes of '",
                                                     info.path(), "': ", std::strerror(errno)));
  }
  return SharedMemoryRegion(owner, info.region(), static_cast<uint8_t*>(data), info.bytes());
}

absl::StatusOr<v1::SharedMemoryRef> SharedMemoryRegion::Ref(uint64_t offset,
                                                            uint64_t length) const {
  if (!mapped()) return absl::FailedPreconditionError("the region is not mapped");
  if (offset % kSharedMemoryAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset = ", offset, " must be a multiple of ", kSharedMemoryAlignment));
  }
  if (offset > size_ || length > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("offset = ", offset, " + length = ", length,
                                                   " must be <= the region's ", size_, " bytes"));
  }
  v1::SharedMemoryRef ref;
  ref.set_region(region_);
  ref.set_offset(offset);
  ref.set_length(length);
  return ref;
}

absl::StatusOr<absl::Span<const uint8_t>> SharedMemoryRegion::View(const v1::SharedMemoryRef& ref,
                                                                   const std::string& field) const {
  if (ref.region() != region_) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".region = '", ref.region(), "' is not this region ('", region_, "')"));
  }
  auto checked = Ref(ref.offset(), ref.length());
  if (!checked.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", checked.status().message()));
  }
  return absl::Span<const uint8_t>(data_ + ref.offset(), static_cast<size_t>(ref.length()));
}

void SharedMemoryRegion::Unmap() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

absl::Status SharedMemoryRegion::Release() {
  if (!mapped()) return absl::OkStatus();
  absl::Status status;
  if (owner_ != nullptr) status = owner_->ReleaseSharedMemory(region_).status();
  Unmap();
  owner_ = nullptr;
  return status;
}

}  // namespace verifyd
