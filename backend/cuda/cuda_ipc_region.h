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
#include "backend/external_tensors.h"

namespace verifyd {

class CudaIpcRegion : public ExternalRegion {
 public:
  // Opens `handle` on `device` (the daemon's). INVALID_ARGUMENT, naming the field and bound, when
  // the handle is not 64 bytes, names another device, `bytes` is 0 or exceeds the allocation, or
  // the driver refuses it (a stale handle, one of this process, a foreign one); nothing stays open
  // then.
  static absl::StatusOr<std::unique_ptr<CudaIpcRegion>> Open(const ExternalMemoryHandle& handle,
                                                             int device);
  // Closes the mapping (cudaIpcCloseMemHandle). The caller guarantees no queued call uses it.
  ~CudaIpcRegion() override;
  CudaIpcRegion(const CudaIpcRegion&) = delete;
  CudaIpcRegion& operator=(const CudaIpcRegion&) = delete;

  void* data() const override { return data_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  CudaIpcRegion(void* data, uint64_t bytes, int device)
      : data_(data), bytes_(bytes), device_(device) {}
  void* data_;
  uint64_t bytes_;
  int device_;
};

}  // namespace verifyd
