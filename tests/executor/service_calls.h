// The executor tests' calls as the service makes them: the service's limits for a device, and a
// request decoded (service/request_validation.h), run on DeviceOperations and encoded
// (service/response_encoding.h).
#pragma once

#include "absl/status/status.h"
#include "executor/device_operations.h"
#include "service/request_validation.h"
#include "service/response_encoding.h"
#include "service/service_options.h"

namespace verifyd::testing {

// The service's limits for a device of `layers` layers and `heads` heads.
inline ValidationLimits Limits(int layers, int heads) {
  ServiceOptions options;
  options.layers = layers;
  options.heads = heads;
  return LimitsFromOptions(options);
}

inline absl::Status AppendAsService(DeviceOperations& ops, const v1::AppendRequest& request,
                                    const ValidationLimits& limits) {
  auto call = ValidateAppend(request, limits);
  if (!call.ok()) return call.status();
  return ops.Append(*call).status();
}

inline absl::Status VerifyAsService(DeviceOperations& ops, const v1::VerifyRequest& request,
                                    const ValidationLimits& limits, v1::VerifyResponse* response) {
  auto call = ValidateVerify(request, limits);
  if (!call.ok()) return call.status();
  absl::StatusOr<VerifyResult> result = ops.Verify(*call);
  if (!result.ok()) return result.status();
  EncodeVerify(request, *call, *std::move(result), response);
  return absl::OkStatus();
}

}  // namespace verifyd::testing
