// RAII owners of the CUDA resources the device store and the CUDA backend share: the device's one
// stream, device buffers and pinned host buffers that grow geometrically (never per call).
//
// Growth frees the old allocation, so it first waits for the stream: work already enqueued may
// still read or write the old bytes. Callers grow before they enqueue (or capture) the work that
// uses the new size.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/align.h"

namespace verifyd {

// A non-blocking stream on one device. Shared (shared_ptr) by the storage and the backend so that
// it outlives whichever of them is destroyed last.
class CudaStream {
 public:
  static absl::StatusOr<std::shared_ptr<CudaStream>> Create(int device);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  // Makes the device current on the calling thread (the executor thread is not the thread that
  // created the backend, and the current device is per thread).
  absl::Status MakeDeviceCurrent() const;
  absl::Status Synchronize() const;

 private:
  CudaStream(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  int device_;
  cudaStream_t stream_;
};

// Device memory. Reserve() discards the contents when it grows: every user rewrites its bytes for
// each call.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Exactly `bytes` (the KV pool: no geometric slack). RESOURCE_EXHAUSTED names `what`.
  absl::Status AllocateExact(size_t bytes, const char* what);
  // Ensures capacity >= bytes, growing to max(bytes, 2 * capacity) after synchronizing `stream`;
  // a new allocation is zeroed on `stream`. Returns whether the pointer changed.
  absl::StatusOr<bool> Reserve(size_t bytes, const CudaStream& stream);

  void* get() const { return ptr_; }
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(ptr_) + byte_offset);
  }
  size_t capacity() const { return capacity_; }

 private:
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};

// Page-locked host memory: async copies from/to it are real DMA and can be captured in a graph.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  absl::StatusOr<bool> Reserve(size_t bytes, const CudaStream& stream);
  // Ensures capacity >= bytes keeping the first keep_bytes; does not wait for any stream, so the
  // caller must know that no queued copy uses the buffer.
  absl::Status ReserveKeeping(size_t bytes, size_t keep_bytes);
  // Once, on an empty buffer, instead of growing it: `bytes` mapped into the device's address
  // space, so that kernels write it directly (device_as); such a buffer is never grown.
  absl::Status AllocateMapped(size_t bytes);

  void* get() const { return ptr_; }
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(ptr_) + byte_offset);
  }
  // The device's pointer to the same bytes (AllocateMapped only; null otherwise).
  template <typename T>
  T* device_as(size_t byte_offset = 0) const {
    return device_ptr_ == nullptr
               ? nullptr
               : reinterpret_cast<T*>(static_cast<uint8_t*>(device_ptr_) + byte_offset);
  }
  size_t capacity() const { return capacity_; }

 private:
  void* ptr_ = nullptr;
  void* device_ptr_ = nullptr;
  size_t capacity_ = 0;
};

// Rounds up to the 256-byte alignment cudaMalloc gives, so that every region of a packed buffer
// starts where the kernels' 16-byte vector loads (and the planner's workspace) expect.

}  // namespace verifyd
