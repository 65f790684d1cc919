// The few CUDA driver calls the runtime API has no equivalent for: stream memory operations on
// flag words (cuStreamWaitValue32 / cuStreamWriteValue32, the data plane's stream order), a
// pointer's allocation range (cuMemGetAddressRange, to check an opened IPC region's size) and the
// device's MPS attribute (CU_DEVICE_ATTRIBUTE_MPS_ENABLED).
//
// Reached through cudaGetDriverEntryPointByVersion, not by linking libcuda (CUDA::cuda_driver):
// every binary that links the CUDA backend then starts on a machine without a driver (CI runs the
// host tests and skips the GPU ones there), exactly as with the static runtime alone. The runtime
// has loaded the driver by the time it answers, so the pointers are the driver's own.
//
// In base/ (not backend/cuda/) because two rooms need it: the CUDA backend and the data-plane C
// library a scheduler loads (client/c_api: its stream-order helpers and IPC registration).
// Target verifyd_cuda_driver, built only with CUDA.
#pragma once

#include <string>

#include <cuda.h>  // types and enums only; nothing here links against libcuda

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace verifyd {

struct CudaDriverApi {
  CUresult (*stream_wait_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*stream_write_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*mem_get_address_range)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*device_get_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
};

// Resolved once per process (thread-safe); FAILED_PRECONDITION naming the symbol when the driver
// lacks one (a driver older than CUDA 12).
absl::StatusOr<const CudaDriverApi*> GetCudaDriverApi();

// INTERNAL naming file:line, the call and the driver's error name.
absl::Status CuResultToStatus(CUresult result, const char* expr, const char* file, int line);

// Whether contexts on `device` are shared through MPS (CU_DEVICE_ATTRIBUTE_MPS_ENABLED, CUDA 13):
// true when this process runs as an MPS client. Initializes the runtime on the device.
absl::StatusOr<bool> MpsActive(int device);

// The device's UUID as nvidia-smi and DCGM print it (base/gpu_uuid.h), from
// cudaGetDeviceProperties (whole GPUs; a MIG instance reports its own UUID there, which DCGM does
// not label with: plans/0003).
absl::StatusOr<std::string> GpuUuid(int device);

}  // namespace verifyd

// The driver-API twin of VERIFYD_CUDA_CHECK (base/cuda_check.h): evaluates a CUresult expression
// and returns an INTERNAL Status naming file:line and the call on failure.
#define VERIFYD_CU_CHECK(expr)                                          \
  do {                                                                  \
    ::absl::Status verifyd_cu_status_ =                                 \
        ::verifyd::CuResultToStatus((expr), #expr, __FILE__, __LINE__); \
    if (!verifyd_cu_status_.ok()) return verifyd_cu_status_;            \
  } while (0)
