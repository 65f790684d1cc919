// The step area's file (step_area.h has the layout and the protocol): the daemon creates it at
// PrepareCapture (shm_open O_EXCL, mode 0600, pages allocated up front, as a channel's ring) and
// the engine's process opens it by name. Host code only: the words the two sides write are read
// and stored here through std::atomic_ref (acquire / release), the record is copied plainly.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/shm_file.h"
#include "channel/step_area.h"

namespace verifyd::channel {

// A mapping of a step area; unmaps on destruction (the name is the creator's to unlink).
class StepAreaMapping {
 public:
  StepAreaMapping() = default;
  StepAreaMapping(void* data, uint64_t bytes) : data_(static_cast<uint8_t*>(data)), bytes_(bytes) {}
  ~StepAreaMapping() { Reset(); }
  StepAreaMapping(const StepAreaMapping&) = delete;
  StepAreaMapping& operator=(const StepAreaMapping&) = delete;
  StepAreaMapping(StepAreaMapping&& o) noexcept { *this = std::move(o); }
  StepAreaMapping& operator=(StepAreaMapping&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = o.data_;
      bytes_ = o.bytes_;
      o.data_ = nullptr;
    }
    return *this;
  }

  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  StepAreaHeader& header() const { return *reinterpret_cast<StepAreaHeader*>(data_); }

  static uint64_t Load(const uint64_t& word) {
    return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(std::memory_order_acquire);
  }
  static void Store(uint64_t& word, uint64_t value) {
    std::atomic_ref<uint64_t>(word).store(value, std::memory_order_release);
  }

 private:
  void Reset() {
    if (data_ != nullptr) munmap(data_, bytes_);
    data_ = nullptr;
  }
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// Daemon: a fresh area under `name` for a bucket of max_batch sequences of max_q nodes each over
// num_layers layers from layer_begin, with `epoch` (non-zero) in place.
inline absl::StatusOr<StepAreaMapping> CreateStepAreaFile(const std::string& name,
                                                          uint32_t max_batch, uint32_t max_q,
                                                          uint32_t layer_begin, uint32_t num_layers,
                                                          uint64_t epoch) {
  const uint64_t bytes = StepAreaBytes(max_batch, max_q);
  absl::StatusOr<void*> data = CreateSharedMemoryFile(name, bytes, "a step area");
  if (!data.ok()) return data.status();
  StepAreaMapping mapping(*data, bytes);
  StepAreaHeader& h = mapping.header();
  h.version = kStepAreaVersion;
  h.max_batch = max_batch;
  h.max_q = max_q;
  h.num_layers = num_layers;
  h.layer_begin = layer_begin;
  h.entry_bytes = StepEntryBytes(max_q);
  StepAreaMapping::Store(h.epoch, epoch);
  std::atomic_ref<uint32_t>(h.magic).store(kStepAreaMagic, std::memory_order_release);
  return mapping;
}

// Engine: maps the area the daemon created; FAILED_PRECONDITION when it is not a step area of
// this version and size.
inline absl::StatusOr<StepAreaMapping> OpenStepAreaFile(const std::string& name, uint64_t bytes) {
  if (bytes < kStepHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes = ", bytes, " is smaller than a step area's header"));
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm_open '", name, "': ", std::strerror(errno),
                     " (the engine must run on the daemon's host, as the daemon's user)"));
  }
  struct stat st {};
  void* data = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= bytes) {
    data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (data == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map the ", bytes, " bytes of step area '", name, "'"));
  }
  StepAreaMapping mapping(data, bytes);
  const StepAreaHeader& h = mapping.header();
  if (h.magic != kStepAreaMagic || h.version != kStepAreaVersion ||
      StepAreaBytes(h.max_batch, h.max_q) != bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", name, "' is not a version ", kStepAreaVersion, " step area of ", bytes, " bytes"));
  }
  return mapping;
}

}  // namespace verifyd::channel
