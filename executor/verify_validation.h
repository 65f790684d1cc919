// The rules of a Verify's header and of a commit spec, on plain views, shared by every way a
// request arrives: the gRPC edge (service/request_validation.cc decodes protobuf into these
// views) and the channel (executor/channel_server.cc decodes ring descriptors into them). One
// function each, so both paths answer the same codes and messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "executor/request_types.h"
#include "verify/kv_dtype.h"

namespace verifyd {

struct ValidationLimits {
  int layers = 0;
  int heads = 0;
  int max_tree_nodes = 0;
  float default_scale = 0.f;
  int64_t max_message_bytes = 0;  // bounds the gRPC response too
  // The store's rows: Append takes rows in the fp8 layout only where they are fp8.
  KvDtype kv_dtype = KvDtype::kBf16;
};

struct CommitSpecView {
  uint32_t commit_length = 0;
  absl::Span<const int32_t> accepted_path;
};

struct VerifySequenceView {
  uint64_t sequence_id = 0;
  absl::Span<const int32_t> parents;
  std::optional<CommitSpecView> commit_previous;
};

struct VerifyHeaderView {
  uint32_t layer = 0;
  std::vector<VerifySequenceView> sequences;
  bool return_lse = false;
  std::optional<float> softmax_scale;
};

// layer < --layers, sequences not empty, softmax_scale finite, > 0 and <= kMaxSoftmaxScale, no
// sequence twice, each sequence's parents (CheckParents, verify/tree_parents.h) and commit_previous
// (DecodeCommit). Fills layer, items, qo_indptr, total_q, num_heads, return_lse and scale; the
// tensors are the caller's.
absl::StatusOr<VerifyCall> ValidateVerifyHeader(const VerifyHeaderView& view,
                                                const ValidationLimits& limits);

// commit_length equals the path's size; every node in [0, --max-tree-nodes).
absl::StatusOr<CommitPath> DecodeCommit(const CommitSpecView& spec, const std::string& field,
                                        int max_tree_nodes);

}  // namespace verifyd
