// The one place where absl::Status becomes grpc::Status.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace verifyd {

grpc::Status ToGrpcStatus(const absl::Status& status);
// Upper-case code name for the `code` metric label ("OK", "INVALID_ARGUMENT", ...).
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace verifyd
