// Decoding and validation of every request field into plain structs, before any state is touched.
// What needs the store's state (unknown sequence, pending-tree mismatch, path vs pending Q,
// capacity) is checked by KvStore, which also changes nothing when it fails.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/external_regions.h"
#include "executor/request_types.h"
#include "executor/step_capture.h"
#include "executor/verify_validation.h"
#include "service/service_options.h"
#include "service/shared_memory_registry.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd {

ValidationLimits LimitsFromOptions(const ServiceOptions& options);

// The request fields that carry the store's parameters, for the store's messages: a store error
// names what the client sent ("sequences[1].commit_previous.accepted_path[0] = 3 ...").
KvFieldNames RequestFieldNames();

// The shared-memory regions a validated call reads or writes. The call's pointers point into
// them, so the caller holds the pins until the call has finished: a region released or expired
// meanwhile stays mapped.
using RegionPins = std::vector<std::shared_ptr<MappedSharedMemory>>;

// A Tensor may carry inline_data or a shared_memory range (plans/0010): the region must be live
// (NOT_FOUND otherwise), the offset a multiple of 64, the range inside the region and its length
// exactly what the shape needs. Without `regions`, shared-memory tensors are FAILED_PRECONDITION.
// The regions named are looked up (which renews their leases) and appended to `pins`.
// Registered external memory a request may name (Append.kv.external_memory, plans/0017): the
// client's regions only; the regions named are appended to `pins`.
struct ExternalAccess {
  ExternalRegionTable* table = nullptr;
  std::string owner;
  ExternalPins* pins = nullptr;
};

// Append.kv may also name external memory (`external`; without it FAILED_PRECONDITION): the
// region must be the client's (NOT_FOUND / PERMISSION_DENIED), the offset a multiple of 64, the
// shape's bytes inside the region.
absl::StatusOr<AppendCall> ValidateAppend(const v1::AppendRequest& request,
                                          const ValidationLimits& limits,
                                          SharedMemoryRegistry* regions = nullptr,
                                          RegionPins* pins = nullptr,
                                          const ExternalAccess* external = nullptr);
// Also out_shared_memory / lse_shared_memory (lse only with return_lse): the same checks, and no
// output range may overlap the other output nor q or tree_kv. They set the call's destinations.
absl::StatusOr<VerifyCall> ValidateVerify(const v1::VerifyRequest& request,
                                          const ValidationLimits& limits,
                                          SharedMemoryRegistry* regions = nullptr,
                                          RegionPins* pins = nullptr);
absl::StatusOr<CommitCall> ValidateCommit(const v1::CommitRequest& request,
                                          const ValidationLimits& limits);
absl::StatusOr<ReleaseCall> ValidateRelease(const v1::ReleaseRequest& request);
// Fork: distinct ids, 1 <= length < 2^31 (the store checks the rest: plans/0019).
absl::StatusOr<ForkCall> ValidateFork(const v1::ForkRequest& request);
// The most SequenceInfo entries a ListSequencesResponse may carry within limits.max_message_bytes
// (each entry is at most kMaxSequenceInfoBytes on the wire; response_encoding_test checks it).
inline constexpr int64_t kMaxSequenceInfoBytes = 64;
int64_t MaxListedSequences(const ValidationLimits& limits);
// limit 0 means 1000; any limit is lowered to MaxListedSequences (the answer says truncated).
absl::StatusOr<ListSequencesCall> ValidateListSequences(const v1::ListSequencesRequest& request,
                                                        const ValidationLimits& limits);
absl::StatusOr<CompactCall> ValidateCompact(const v1::CompactRequest& request);
// PrepareCapture's fields as the executor's CaptureSpec; every rule (the bucket against the
// daemon's limits, the memory it names) is StepCapture::Create's, which knows the regions.
CaptureSpec DecodeCapture(const v1::PrepareCaptureRequest& request);
absl::StatusOr<GetCompactionCall> ValidateGetCompaction(const v1::GetCompactionRequest& request);

}  // namespace verifyd
