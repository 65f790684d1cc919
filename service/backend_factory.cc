#include "service/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_backend.h"
#include "base/status_macros.h"
#ifdef VERIFYD_HAVE_CUDA_BACKEND
#include "backend/cuda/cuda_backend.h"
#endif

namespace verifyd {

#ifdef VERIFYD_HAVE_CUDA_BACKEND
namespace {

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const ServiceOptions& options) {
  CudaBackendOptions cuda;
  cuda.device = options.device;
  cuda.cuda_graphs = options.cuda_graphs;
  cuda.flash_path = options.portable_flash_kernel ? FlashPath::kPortable : FlashPath::kAuto;
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(cuda));
  return std::unique_ptr<ComputeBackend>(std::move(backend));
}

}  // namespace
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

// Both backends store either dtype (--kv_dtype reaches CreateStorage); a backend that stores bf16
// only would refuse fp8 there, at start, with its name (ComputeBackend::CreateStorage).
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
