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

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/sealed_memfd.h"

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
  const std::string& path = handle.handle;
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "handle is empty; the cpu backend takes /proc/<pid>/fd/<n>, a sealed memfd of the calling "
        "process");
  }
  if (const size_t nul = path.find('\0'); nul != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("handle has a NUL byte at offset ", nul, "; it must be a path"));
  }
  if (handle.bytes == 0) return absl::InvalidArgumentError("bytes = 0 must be > 0");
  if (handle.client_pid <= 0) {
    return absl::FailedPreconditionError(
        "the cpu backend maps memory of the calling process only, which it knows on the Unix "
        "socket; register over the Unix socket");
  }
  const std::string prefix = absl::StrCat("/proc/", handle.client_pid, "/fd/");
  int descriptor = -1;
  if (!absl::StartsWith(path, prefix) ||
      !absl::SimpleAtoi(absl::string_view(path).substr(prefix.size()), &descriptor) ||
      descriptor < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handle = '", path, "' must be ", prefix, "<n>: a descriptor of the calling process (pid ",
        handle.client_pid, ") that is a sealed memfd; the cpu backend maps no other file"));
  }
  // O_NONBLOCK and O_NOCTTY: opening what turns out not to be a memfd (a FIFO, a terminal) must
  // neither block nor change anything.
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    const std::string why = absl::StrCat("handle: cannot open '", path, "': ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(why);
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(
          absl::StrCat(why, " (the scheduler must run as the daemon's user)"));
    }
    return absl::InvalidArgumentError(why);
  }
  absl::Status status = CheckSealedMemfd(fd, path, handle.bytes);
  void* data = MAP_FAILED;
  if (status.ok()) {
    data = mmap(nullptr, handle.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      status =
          absl::InvalidArgumentError(absl::StrCat("handle: mmap of ", handle.bytes, " bytes of '",
                                                  path, "' read-write: ", std::strerror(errno)));
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
