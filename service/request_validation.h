// Decoding and validation of every request field into plain structs, before any state is touched.
// What needs the store's state (unknown sequence, pending-tree mismatch, path vs pending Q,
// capacity) is checked by KvStore, which also changes nothing when it fails.
#pragma once

#include "absl/status/statusor.h"
#include "service/request_types.h"
#include "service/service_options.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd {

struct ValidationLimits {
  int layers = 0;
  int heads = 0;
  int max_tree_nodes = 0;
  float default_scale = 0.f;
  int64_t max_message_bytes = 0;  // bounds the response too
};

ValidationLimits LimitsFromOptions(const ServiceOptions& options);

absl::StatusOr<AppendCall> ValidateAppend(const v1::AppendRequest& request,
                                          const ValidationLimits& limits);
absl::StatusOr<VerifyCall> ValidateVerify(const v1::VerifyRequest& request,
                                          const ValidationLimits& limits);
absl::StatusOr<CommitCall> ValidateCommit(const v1::CommitRequest& request,
                                          const ValidationLimits& limits);
absl::StatusOr<ReleaseCall> ValidateRelease(const v1::ReleaseRequest& request);
absl::StatusOr<CompactCall> ValidateCompact(const v1::CompactRequest& request);
absl::StatusOr<GetCompactionCall> ValidateGetCompaction(const v1::GetCompactionRequest& request);

}  // namespace verifyd
