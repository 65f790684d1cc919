#include "executor/verify_validation.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "verify/tree_parents.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

}  // namespace

absl::StatusOr<CommitPath> DecodeCommit(const CommitSpecView& spec, const std::string& field,
                                        int max_tree_nodes) {
  if (static_cast<int64_t>(spec.commit_length) != static_cast<int64_t>(spec.accepted_path.size())) {
    return Invalid(absl::StrCat(field, ".commit_length = ", spec.commit_length,
                                " must equal the size of ", field,
                                ".accepted_path = ", spec.accepted_path.size()));
  }
  CommitPath path;
  path.accepted_path.reserve(spec.accepted_path.size());
  for (size_t k = 0; k < spec.accepted_path.size(); ++k) {
    const int32_t node = spec.accepted_path[k];
    if (node < 0 || node >= max_tree_nodes) {
      return Invalid(absl::StrCat(field, ".accepted_path[", k, "] = ", node,
                                  " must be in [0, --max-tree-nodes = ", max_tree_nodes, ")"));
    }
    path.accepted_path.push_back(node);
  }
  return path;
}

absl::StatusOr<VerifyCall> ValidateVerifyHeader(const VerifyHeaderView& view,
                                                const ValidationLimits& limits) {
  if (view.layer >= static_cast<uint32_t>(limits.layers)) {
    return Invalid(absl::StrCat("layer = ", view.layer, " must be < --layers = ", limits.layers));
  }
  if (view.sequences.empty()) return Invalid("sequences must not be empty");
  VerifyCall call;
  call.layer = static_cast<int>(view.layer);
  call.num_heads = limits.heads;
  call.return_lse = view.return_lse;
  call.scale = limits.default_scale;
  if (view.softmax_scale.has_value()) {
    const float s = *view.softmax_scale;
    if (!std::isfinite(s) || s <= 0.f || s > kMaxSoftmaxScale) {
      return Invalid(absl::StrCat("softmax_scale = ", s, " must be finite and > 0, and <= ",
                                  kMaxSoftmaxScale, " (SPEC §1: scores stay finite)"));
    }
    call.scale = s;
  }
  call.items.reserve(view.sequences.size());
  call.qo_indptr.reserve(view.sequences.size() + 1);
  call.qo_indptr.push_back(0);
  absl::flat_hash_map<SequenceId, int> first_index;
  int64_t total_q = 0;
  for (size_t b = 0; b < view.sequences.size(); ++b) {
    const VerifySequenceView& seq = view.sequences[b];
    const std::string field = absl::StrCat("sequences[", b, "]");
    auto [it, inserted] = first_index.emplace(seq.sequence_id, static_cast<int>(b));
    if (!inserted) {
      return Invalid(absl::StrCat(field, ".sequence_id = ", seq.sequence_id, " repeats sequences[",
                                  it->second, "]; a sequence may appear once per Verify"));
    }
    VERIFYD_RETURN_IF_ERROR(CheckParents(seq.parents, limits.max_tree_nodes,
                                         absl::StrCat(field, ".parents"), "--max-tree-nodes"));
    VerifyItem item;
    item.sequence = seq.sequence_id;
    item.parents.assign(seq.parents.begin(), seq.parents.end());
    if (seq.commit_previous.has_value()) {
      VERIFYD_ASSIGN_OR_RETURN(
          item.commit, DecodeCommit(*seq.commit_previous, absl::StrCat(field, ".commit_previous"),
                                    limits.max_tree_nodes));
    }
    total_q += static_cast<int64_t>(seq.parents.size());
    call.qo_indptr.push_back(static_cast<int32_t>(total_q));
    call.items.push_back(std::move(item));
  }
  call.total_q = static_cast<int>(total_q);
  return call;
}

}  // namespace verifyd
