// Splits an AppendRequest along T so that every message fits under the gRPC message limit.
//
// Each chunk carries the same sequence and layer range and the next run of tokens; the daemon
// appends a chunk at each layer's fill level, so sending the chunks in order appends the whole
// tensor. Only each chunk is atomic on the daemon (SPEC §2), not the whole split request.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd {

// Room left in a message for everything but the KV payload (ids, layer range, dtype, shape, tags).
inline constexpr int64_t kAppendEnvelopeBytes = 1024;

// Returns the request itself when it fits in max_message_bytes; otherwise chunks of as many whole
// tokens as fit. INVALID_ARGUMENT when the kv tensor is malformed (rank, dtype, byte length) or one
// token of every layer alone exceeds the limit.
absl::StatusOr<std::vector<v1::AppendRequest>> SplitAppend(const v1::AppendRequest& request,
                                                           int64_t max_message_bytes);

}  // namespace verifyd
