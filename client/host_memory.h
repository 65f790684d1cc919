// verifyd::HostMemory: memory a scheduler registers with a cpu-backend daemon
// (Client::RegisterExternalMemory(memory.handle(), memory.bytes())), standing in for the device
// memory a cuda-backend daemon takes as CUDA IPC handles. A memfd with its pages allocated and
// sealed against shrinking and growing, mapped here; the daemon maps the same pages through
// handle() (/proc/<pid>/fd/<n>) and maps nothing else (base/sealed_memfd.h says why).
//
// Movable, not copyable; the descriptor stays open while the object lives, so handle() stays
// valid for a registration at any time. Register it through a Client connected on the Unix
// socket: the daemon opens descriptors of the calling process only.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace verifyd {

class HostMemory {
 public:
  // `bytes` >= 1, rounded up to whole pages; zero-filled.
  static absl::StatusOr<HostMemory> Create(uint64_t bytes);
  HostMemory() = default;
  HostMemory(HostMemory&& other) noexcept;
  HostMemory& operator=(HostMemory&& other) noexcept;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  ~HostMemory();

  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  // What RegisterExternalMemory's handle is.
  std::string handle() const;

 private:
  void Reset();
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace verifyd
