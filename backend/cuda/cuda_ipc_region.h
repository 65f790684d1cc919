// Device memory another process on the same GPU registered with the daemon, opened through a CUDA
// IPC memory handle (cudaIpcGetMemHandle in the exporting process, cudaIpcOpenMemHandle here).
//
// Why IPC handles and not the driver's shareable handles (cuMemExportToShareableHandle + a POSIX
// fd passed over a Unix socket): IPC handles are 64 plain bytes that travel in a gRPC message, they
// open under MPS on the H200 (plans/0018-data-plane-gpu.md records the check), and they work on any
// cudaMalloc allocation, which is what a PyTorch or TensorRT-LLM scheduler holds. The fd route
// needs allocations made with cuMemCreate and a socket beside gRPC; nothing we need requires it.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "backend/cuda/cuda_device_memory.h"
#include "backend/external_tensors.h"

namespace verifyd {

class CudaIpcRegion : public ExternalRegion {
 public:
  // Opens `handle` on `stream`'s device (the daemon's). INVALID_ARGUMENT, naming the field and
  // bound, when the handle is not 64 bytes, names another device, `bytes` is 0 or exceeds the
  // allocation, or the driver refuses it (a stale handle, one of this process, a foreign one);
  // nothing stays open then.
  static absl::StatusOr<std::unique_ptr<CudaIpcRegion>> Open(const ExternalMemoryHandle& handle,
                                                             std::shared_ptr<CudaStream> stream);
  // Waits for the backend's stream, then closes the mapping (cudaIpcCloseMemHandle).
  // ComputeVerifyExternal returns before the device has run the call, so the caller's pins end
  // before the device stops using the region: the wait makes closing safe whenever the last
  // holder lets go. It also means a call still waiting for a ready flag that will never come
  // holds the destructor: the daemon releases such waits (ReleaseExternalWait) first.
  ~CudaIpcRegion() override;
  CudaIpcRegion(const CudaIpcRegion&) = delete;
  CudaIpcRegion& operator=(const CudaIpcRegion&) = delete;

  void* data() const override { return data_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  CudaIpcRegion(void* data, uint64_t bytes, std::shared_ptr<CudaStream> stream)
      : data_(data), bytes_(bytes), stream_(std::move(stream)) {}
  void* data_;
  uint64_t bytes_;
  std::shared_ptr<CudaStream> stream_;
};

}  // namespace verifyd
