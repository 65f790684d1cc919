#include "base/cuda_driver.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/gpu_uuid.h"
#include "base/status_macros.h"

namespace verifyd {
namespace {

// The ABI version the pointers are asked for: CUDA 12.0's (cuStreamWaitValue32 is then its _v2,
// which takes the 64-bit CUdeviceptr of the prototypes above).
constexpr unsigned int kDriverAbiVersion = 12000;

template <typename Fn>
absl::Status Resolve(const char* symbol, Fn* fn) {
  void* pointer = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &pointer, kDriverAbiVersion,
                                                           cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || pointer == nullptr) {
    cudaGetLastError();  // not sticky; keep later checks truthful
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver has no ", symbol, " (", cudaGetErrorName(err), ", query ",
                     static_cast<int>(found), "): a driver for CUDA 12 or later is needed"));
  }
  *fn = reinterpret_cast<Fn>(pointer);
  return absl::OkStatus();
}

absl::StatusOr<CudaDriverApi> ResolveAll() {
  CudaDriverApi api;
  VERIFYD_RETURN_IF_ERROR(Resolve("cuStreamWaitValue32", &api.stream_wait_value32));
  VERIFYD_RETURN_IF_ERROR(Resolve("cuStreamWriteValue32", &api.stream_write_value32));
  VERIFYD_RETURN_IF_ERROR(Resolve("cuMemGetAddressRange", &api.mem_get_address_range));
  VERIFYD_RETURN_IF_ERROR(Resolve("cuDeviceGetAttribute", &api.device_get_attribute));
  VERIFYD_RETURN_IF_ERROR(Resolve("cuGetErrorName", &api.get_error_name));
  VERIFYD_RETURN_IF_ERROR(Resolve("cuDeviceGet", &api.device_get));
  return api;
}

}  // namespace

absl::StatusOr<const CudaDriverApi*> GetCudaDriverApi() {
  // Resolved once; a failure is remembered too (the driver does not change under a process).
  static const absl::StatusOr<CudaDriverApi>* const api =
      new absl::StatusOr<CudaDriverApi>(ResolveAll());
  if (!api->ok()) return api->status();
  return &**api;
}

absl::Status CuResultToStatus(CUresult result, const char* expr, const char* file, int line) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  absl::StatusOr<const CudaDriverApi*> api = GetCudaDriverApi();
  if (!api.ok() || (*api)->get_error_name(result, &name) != CUDA_SUCCESS) name = nullptr;
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr,
                                          " failed: ", name != nullptr ? name : "CUresult ",
                                          name != nullptr ? "" : absl::StrCat(result)));
}

absl::StatusOr<bool> MpsActive(int device) {
  VERIFYD_CUDA_CHECK(cudaSetDevice(device));
  VERIFYD_CUDA_CHECK(cudaFree(nullptr));  // creates the context: the MPS client connects here
  absl::StatusOr<const CudaDriverApi*> api = GetCudaDriverApi();
  if (!api.ok()) return api.status();
  CUdevice handle = 0;
  VERIFYD_CU_CHECK((*api)->device_get(&handle, device));
  int enabled = 0;
  VERIFYD_CU_CHECK((*api)->device_get_attribute(&enabled, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, handle));
  return enabled != 0;
}

absl::StatusOr<std::string> GpuUuid(int device) {
  cudaDeviceProp properties{};
  VERIFYD_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  std::array<uint8_t, 16> bytes{};
  static_assert(sizeof(properties.uuid.bytes) == bytes.size());
  std::memcpy(bytes.data(), properties.uuid.bytes, bytes.size());
  return FormatGpuUuid(bytes);
}

}  // namespace verifyd
