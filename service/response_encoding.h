// Encoding of the executor's plain results into the protobuf responses: the mirror of
// request_validation.h. Nothing here touches device state; each function only writes `response`.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/compaction_manager.h"
#include "executor/request_types.h"
#include "kvstore/fragmentation_tracker.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd {

void EncodeAppend(const AppendResult& result, v1::AppendResponse* response);
// out and lse get dtype and shape; their bytes move from `result` into inline_data, or, where the
// call wrote them to the client's shared memory, the response names the request's range.
void EncodeVerify(const v1::VerifyRequest& request, const VerifyCall& call, VerifyResult result,
                  v1::VerifyResponse* response);
void EncodeCommit(const CommitResult& result, v1::CommitResponse* response);
void EncodeRelease(const ReleaseResult& result, v1::ReleaseResponse* response);
void EncodeFork(const ForkResult& result, v1::ForkResponse* response);
// heads and softmax_scale are the daemon's settings, not device state.
void EncodeStats(const DeviceStats& stats, int heads, float softmax_scale,
                 v1::StatsResponse* response);
void EncodeSequences(const SequencePage& page, v1::ListSequencesResponse* response);
void EncodeCompactionStatus(const CompactionOperation& op, v1::CompactionStatus* response);
void EncodeFragmentation(const FragmentationStats& stats, v1::Fragmentation* out);

// The executor's answer, encoded: its status when it failed (the response stays untouched),
// else `encode(value, response)` and OK.
template <typename Result, typename Response, typename Encode>
absl::Status EncodeResult(absl::StatusOr<Result> result, Response* response, Encode encode) {
  if (!result.ok()) return result.status();
  encode(*std::move(result), response);
  return absl::OkStatus();
}

}  // namespace verifyd
