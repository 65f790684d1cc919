// Picks and builds the compute backend for --backend (auto: cuda when compiled in and a GPU is
// visible, else cpu).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "backend/compute_backend.h"
#include "service/service_options.h"

namespace verifyd {

// Whether this build can serve --backend at all (cuda needs the CUDA backend compiled in); a
// flag error, checked before anything starts.
absl::Status CheckBackendCompiled(BackendKind kind);

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(const ServiceOptions& options);

}  // namespace verifyd
