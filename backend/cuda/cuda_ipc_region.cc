#include "backend/cuda/cuda_ipc_region.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/cuda_driver.h"
#include "base/status_macros.h"

namespace verifyd {

absl::StatusOr<std::unique_ptr<CudaIpcRegion>> CudaIpcRegion::Open(
    const ExternalMemoryHandle& handle, std::shared_ptr<CudaStream> stream) {
  const int device = stream->device();
  cudaIpcMemHandle_t ipc;
  if (handle.handle.size() != sizeof(ipc)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handle is ", handle.handle.size(), " bytes; a CUDA IPC memory handle is ", sizeof(ipc)));
  }
  if (handle.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("device = ", handle.device, " must be the daemon's device ", device));
  }
  if (handle.bytes == 0) return absl::InvalidArgumentError("bytes = 0 must be > 0");
  std::memcpy(&ipc, handle.handle.data(), sizeof(ipc));
  VERIFYD_RETURN_IF_ERROR(stream->MakeDeviceCurrent());
  VERIFYD_ASSIGN_OR_RETURN(const CudaDriverApi* driver, GetCudaDriverApi());
  void* data = nullptr;
  const cudaError_t opened = cudaIpcOpenMemHandle(&data, ipc, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    cudaGetLastError();  // not sticky: a bad handle must not fail this thread's next call
    return absl::InvalidArgumentError(absl::StrCat(
        "handle does not open (", cudaGetErrorName(opened), ": ", cudaGetErrorString(opened),
        "): stale, exported by this process, or not a CUDA IPC memory handle"));
  }
  // The range of the allocation the handle exported; the region may be a prefix of it, no more.
  CUdeviceptr base = 0;
  size_t size = 0;
  const absl::Status ranged = CuResultToStatus(
      driver->mem_get_address_range(&base, &size, reinterpret_cast<CUdeviceptr>(data)),
      "cuMemGetAddressRange", __FILE__, __LINE__);
  if (!ranged.ok() || handle.bytes > size) {
    if (cudaIpcCloseMemHandle(data) != cudaSuccess) cudaGetLastError();
    if (!ranged.ok()) return ranged;
    return absl::InvalidArgumentError(
        absl::StrCat("bytes = ", handle.bytes, " must be <= the allocation's ", size));
  }
  return std::unique_ptr<CudaIpcRegion>(new CudaIpcRegion(data, handle.bytes, std::move(stream)));
}

CudaIpcRegion::~CudaIpcRegion() {
  // A destructor cannot report; a failure only leaks the mapping until the process ends.
  if (!stream_->MakeDeviceCurrent().ok() || !stream_->Synchronize().ok() ||
      cudaIpcCloseMemHandle(data_) != cudaSuccess) {
    cudaGetLastError();
  }
}

}  // namespace verifyd
