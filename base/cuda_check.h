// VERIFYD_CUDA_CHECK: the one way host code turns a CUDA runtime error into an absl::Status.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace verifyd {

inline absl::Status CudaErrorToStatus(cudaError_t err, const char* expr, const char* file,
                                      int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr,
                                          " failed: ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

}  // namespace verifyd

// Evaluates a cudaError_t expression; on failure returns an INTERNAL Status naming file:line and
// the call.
#define VERIFYD_CUDA_CHECK(expr)                                         \
  do {                                                                   \
    ::absl::Status verifyd_cuda_status_ =                                \
        ::verifyd::CudaErrorToStatus((expr), #expr, __FILE__, __LINE__); \
    if (!verifyd_cuda_status_.ok()) return verifyd_cuda_status_;         \
  } while (0)
