// --max-message-bytes, checked by us rather than by gRPC core (issue 17 defect 7b).
//
// gRPC core refuses a message above the server's receive limit before any C++ code of ours runs
// (handlers and interceptors alike), so such calls never reached verifyd_rpc_requests_total and the
// error-ratio alert could not see a client sending them. gRPC 1.51 has no hook for that refusal.
// So gRPC's limit is set to a ceiling above --max-message-bytes (ReceiveCeiling), and every
// handler checks the bound itself (CheckRequestSize): a request between the two is refused
// RESOURCE_EXHAUSTED naming the flag and counted like every other answer, before the gate or any
// validation, so it changes nothing. Above the ceiling gRPC core still answers alone, uncounted
// (plans/0015, row 7b).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace verifyd {

// gRPC's receive limit for a daemon run with --max-message-bytes = `max_message_bytes`: twice it
// (a client configured for up to twice our bound is still seen and counted), at most INT32_MAX
// (gRPC takes an int). Costs at most one more bound's worth of buffered bytes per call in flight,
// and only for calls that are refused.
int ReceiveCeiling(int64_t max_message_bytes);

// OK, or RESOURCE_EXHAUSTED "<method>: the request has N bytes, more than --max-message-bytes = M".
// `request_bytes` is the request's wire size (Verify: the raw bytes received; callback methods:
// the parsed message's encoded size, equal to the wire size for every protobuf encoder, which
// writes each field once).
absl::Status CheckRequestSize(const char* method, uint64_t request_bytes,
                              int64_t max_message_bytes);

}  // namespace verifyd
