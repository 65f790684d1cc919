// The two grpc.health.v1 messages, encoded by hand with protobuf's wire streams.
//
// Debian's gRPC ships no generated health.proto, and generating our own copy would register
// "grpc/health/v1/health.proto" in the global descriptor pool, where it can collide with another
// copy linked into the same process. The messages are one field each, so the client speaks the
// wire format directly through a generic stub.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace verifyd {

// HealthCheckRequest { string service = 1; }
std::string EncodeHealthCheckRequest(const std::string& service);
// HealthCheckResponse { ServingStatus status = 1; }: the status value (0 when absent, as proto3).
// Unknown fields are skipped; malformed bytes are INTERNAL.
absl::StatusOr<int> DecodeHealthCheckResponse(const std::string& bytes);

}  // namespace verifyd
