// The CUDA entry points (built when the project is built with CUDA): IPC registration of device
// memory and the stream-order helpers, through base/cuda_driver.h (driver entry points resolved by
// the runtime: no libcuda link, so the library loads on a host without a driver and answers with
// an error there).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "base/cuda_driver.h"
#include "client/c_api/handles.h"

using verifyd::c_api::Fail;
using verifyd::c_api::NullArgument;

// A CUresult as a Status (INTERNAL naming the call and the driver's error name).
#define CU_STATUS(expr) ::verifyd::CuResultToStatus((expr), #expr, __FILE__, __LINE__)

namespace {

absl::Status Runtime(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // not sticky: keep later calls truthful
  return absl::FailedPreconditionError(
      absl::StrCat(what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

absl::StatusOr<const verifyd::CudaDriverApi*> Driver() { return verifyd::GetCudaDriverApi(); }

}  // namespace

extern "C" {

int vd_has_cuda(void) { return 1; }

int vd_register_cuda(vd_client* client, uint64_t device_pointer, uint64_t bytes, uint64_t* region,
                     uint64_t* region_base) {
  if (client == nullptr) return NullArgument("vd_register_cuda", "client");
  if (region == nullptr) return NullArgument("vd_register_cuda", "region");
  if (region_base == nullptr) return NullArgument("vd_register_cuda", "region_base");
  if (bytes == 0) return Fail(absl::InvalidArgumentError("bytes = 0 must be > 0"));
  void* pointer = reinterpret_cast<void*>(device_pointer);
  cudaPointerAttributes attributes{};
  if (absl::Status s =
          Runtime(cudaPointerGetAttributes(&attributes, pointer), "cudaPointerGetAttributes");
      !s.ok()) {
    return Fail(s);
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "device_pointer = 0x", absl::Hex(device_pointer), " is not device memory (cuda ",
        "memory type ", static_cast<int>(attributes.type), "); register a CUDA allocation")));
  }
  absl::StatusOr<const verifyd::CudaDriverApi*> driver = Driver();
  if (!driver.ok()) return Fail(driver.status());
  CUdeviceptr base = 0;
  size_t size = 0;
  if (absl::Status s = CU_STATUS(
          (*driver)->mem_get_address_range(&base, &size, static_cast<CUdeviceptr>(device_pointer)));
      !s.ok()) {
    return Fail(s);
  }
  const uint64_t end = device_pointer + bytes;
  if (end < device_pointer || end > base + size) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("device_pointer = 0x", absl::Hex(device_pointer), " + bytes = ", bytes,
                     " must be inside its allocation [0x", absl::Hex(base), ", +", size, ")")));
  }
  cudaIpcMemHandle_t handle;
  if (absl::Status s = Runtime(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)),
                               "cudaIpcGetMemHandle");
      !s.ok()) {
    return Fail(s);
  }
  auto registered = client->client->RegisterExternalMemory(
      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)), end - base,
      static_cast<uint32_t>(attributes.device));
  if (!registered.ok()) return Fail(registered.status());
  *region = registered->region();
  *region_base = base;
  return 0;
}

int vd_stream_write_value32(void* stream, uint64_t device_pointer, uint32_t value) {
  if (device_pointer % 4 != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "device_pointer = 0x", absl::Hex(device_pointer), " must be a multiple of 4")));
  }
  absl::StatusOr<const verifyd::CudaDriverApi*> driver = Driver();
  if (!driver.ok()) return Fail(driver.status());
  return Fail(CU_STATUS((*driver)->stream_write_value32(static_cast<CUstream>(stream),
                                                        static_cast<CUdeviceptr>(device_pointer),
                                                        value, CU_STREAM_WRITE_VALUE_DEFAULT)));
}

int vd_stream_wait_value32(void* stream, uint64_t device_pointer, uint32_t value) {
  if (device_pointer % 4 != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "device_pointer = 0x", absl::Hex(device_pointer), " must be a multiple of 4")));
  }
  absl::StatusOr<const verifyd::CudaDriverApi*> driver = Driver();
  if (!driver.ok()) return Fail(driver.status());
  return Fail(CU_STATUS((*driver)->stream_wait_value32(static_cast<CUstream>(stream),
                                                       static_cast<CUdeviceptr>(device_pointer),
                                                       value, CU_STREAM_WAIT_VALUE_GEQ)));
}

}  // extern "C"
