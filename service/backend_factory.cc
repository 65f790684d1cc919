#include "service/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "service/cpu_backend.h"

namespace verifyd {

// The CUDA backend plugs in here: define VERIFYD_HAVE_CUDA_BACKEND, provide
// CudaBackendAvailable(device) and CreateCudaBackend(options) from service/cuda_backend.*.
#ifdef VERIFYD_HAVE_CUDA_BACKEND
bool CudaBackendAvailable(int device);
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const ServiceOptions& options);
#endif

absl::Status CheckBackendCompiled(BackendKind kind) {
#ifndef VERIFYD_HAVE_CUDA_BACKEND
  if (kind == BackendKind::kCuda) {
    return absl::InvalidArgumentError(
        "--backend = cuda but this build has no CUDA backend; use --backend=cpu or auto");
  }
#endif
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(const ServiceOptions& options) {
  switch (options.backend) {
    case BackendKind::kCpu:
      return std::unique_ptr<ComputeBackend>(new CpuBackend(options.compute_threads));
    case BackendKind::kCuda:
#ifdef VERIFYD_HAVE_CUDA_BACKEND
      if (!CudaBackendAvailable(options.device)) {
        return absl::FailedPreconditionError(
            absl::StrCat("--backend = cuda but --device = ", options.device, " is not visible"));
      }
      return CreateCudaBackend(options);
#else
      return absl::FailedPreconditionError(
          "--backend = cuda but this build has no CUDA backend; use --backend=cpu or auto");
#endif
    case BackendKind::kAuto:
#ifdef VERIFYD_HAVE_CUDA_BACKEND
      if (CudaBackendAvailable(options.device)) return CreateCudaBackend(options);
#endif
      return std::unique_ptr<ComputeBackend>(new CpuBackend(options.compute_threads));
  }
  return absl::InvalidArgumentError("--backend is not set");
}

}  // namespace verifyd
