#include "backend/cpu/cpu_external.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"

namespace verifyd {
namespace {

class MappedFileRegion : public ExternalRegion {
 public:
  MappedFileRegion(void* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  ~MappedFileRegion() override { munmap(data_, bytes_); }
  void* data() const override { return data_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  void* data_;
  uint64_t bytes_;
};

std::atomic_ref<uint32_t> FlagWord(const ExternalFlag& flag) {
  return std::atomic_ref<uint32_t>(*flag.word);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExternalRegion>> OpenCpuExternalRegion(
    const ExternalMemoryHandle& handle) {
  if (handle.handle.empty()) {
    return absl::InvalidArgumentError(
        "handle is empty; the cpu backend takes the path of a shared-memory file");
  }
  if (handle.bytes == 0) return absl::InvalidArgumentError("bytes = 0 must be > 0");
  const int fd = open(handle.handle.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("handle: cannot open '", handle.handle, "': ", std::strerror(errno)));
  }
  struct stat st {};
  absl::Status status;
  void* data = MAP_FAILED;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = absl::InvalidArgumentError(
        absl::StrCat("handle: '", handle.handle, "' is not a regular file"));
  } else if (static_cast<uint64_t>(st.st_size) < handle.bytes) {
    status =
        absl::InvalidArgumentError(absl::StrCat("bytes = ", handle.bytes, " must be <= the ",
                                                st.st_size, " bytes of '", handle.handle, "'"));
  } else {
    data = mmap(nullptr, handle.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("mmap of ", handle.bytes, " bytes: ", std::strerror(errno)));
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return std::unique_ptr<ExternalRegion>(new MappedFileRegion(data, handle.bytes));
}

absl::Status WaitReadyFlag(const ExternalFlag& ready, absl::Duration timeout,
                           const std::atomic<bool>* cancelled) {
  if (ready.word == nullptr) return absl::OkStatus();
  // Wrap-safe comparison would be wrong here: the contract is a plain >= on uint32 values.
  auto reached = [&] { return FlagWord(ready).load(std::memory_order_acquire) >= ready.value; };
  for (int i = 0; i < 2000; ++i) {  // ~ a few µs: a flag set just before the call
    if (reached()) return absl::OkStatus();
  }
  const auto start = std::chrono::steady_clock::now();
  const auto limit = absl::ToChronoNanoseconds(timeout);
  for (int64_t i = 0;; ++i) {
    if (reached()) return absl::OkStatus();
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= limit) break;
    if (cancelled != nullptr && cancelled->load(std::memory_order_relaxed)) {
      return absl::AbortedError(
          "the channel closed while the call waited for its ready flag; the call was not "
          "computed");
    }
    // Yield first (the producer may share this core), then sleep 50 µs steps: no busy core
    // while a slow scheduler prepares q.
    if (i < 1000) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the ready flag stayed ", FlagWord(ready).load(std::memory_order_acquire), " < ", ready.value,
      " for ", absl::FormatDuration(timeout), "; the call was not computed"));
}

void WriteDoneFlag(const ExternalFlag& done) {
  if (done.word != nullptr) FlagWord(done).store(done.value, std::memory_order_release);
}

void FillOutputsWithNan(const ExternalFailure& failure) {
  for (int64_t i = 0; i < failure.out_elements; ++i) failure.out[i] = 0x7FC0;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < failure.lse_elements; ++i) failure.lse[i] = nan;
}

}  // namespace verifyd
