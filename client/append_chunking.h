// Splits an AppendRequest along T so that every message fits under the gRPC message limit.
//
// Each chunk carries the same sequence and layer range and the next run of tokens; the daemon
// appends a chunk at each layer's fill level, so sending the chunks in order appends the whole
// tensor. Only each chunk is atomic on the daemon (SPEC §2), not the whole split request.
// Each chunk states where it writes (expected_position), so a sequence released, expired or lost
// in a restart between two chunks fails the next chunk (FAILED_PRECONDITION) instead of being
// silently re-created with shifted positions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd {

// Where an Append expects to write (SPEC §2): a new sequence, or one whose every layer in the
// request's range holds `fill` tokens.
struct AppendPosition {
  static AppendPosition Create() { return {true, 0}; }
  static AppendPosition Fill(uint64_t tokens) { return {false, tokens}; }
  bool create = false;
  uint64_t fill = 0;
};
void SetExpectedPosition(AppendPosition at, v1::AppendRequest* request);

// Room left in a message for everything but the KV payload (ids, layer range, dtype, shape, tags).
inline constexpr int64_t kAppendEnvelopeBytes = 1024;

// Returns the request itself when it fits in max_message_bytes; otherwise chunks of as many whole
// tokens as fit. INVALID_ARGUMENT when the kv tensor is malformed (rank, dtype, byte length) or one
// token of every layer alone exceeds the limit. Chunk k > 0 expects the fill the chunks before it
// leave: create or expected_fill = e on the request gives chunk k expected_fill = (0 or e) + the
// tokens of chunks 0..k-1; a request without expected_position gives chunks without it (the
// client then fills them in from each chunk's answer).
absl::StatusOr<std::vector<v1::AppendRequest>> SplitAppend(const v1::AppendRequest& request,
                                                           int64_t max_message_bytes);

}  // namespace verifyd
