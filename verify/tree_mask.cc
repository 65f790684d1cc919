#include "verify/tree_mask.h"

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace verifyd {

absl::StatusOr<TreeMask> TreeMask::FromParents(absl::Span<const int32_t> parents, int max_nodes,
                                               const char* field) {
  const size_t n = parents.size();
  if (n < 1 || n > static_cast<size_t>(max_nodes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", n, " nodes; must be in [1, ", max_nodes, "]"));
  }
  for (size_t i = 0; i < n; ++i) {
    const int32_t p = parents[i];
    if (p == -1) continue;
    if (p < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", p, " must be -1 (a root) or >= 0"));
    }
    if (static_cast<size_t>(p) >= i) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] = ", p, " must be < ", i));
    }
  }

  TreeMask mask;
  mask.num_nodes_ = static_cast<int>(n);
  mask.words_per_row_ = WordsPerRow(mask.num_nodes_);
  mask.bits_.assign(n * mask.words_per_row_, 0);
  mask.depth_.assign(n, 0);
  // Parents come before children, so a node's row is its parent's row plus its own bit.
  for (size_t i = 0; i < n; ++i) {
    uint64_t* row = mask.bits_.data() + i * mask.words_per_row_;
    const int32_t p = parents[i];
    if (p >= 0) {
      const uint64_t* parent_row = mask.bits_.data() + static_cast<size_t>(p) * mask.words_per_row_;
      for (int w = 0; w < mask.words_per_row_; ++w) row[w] = parent_row[w];
      mask.depth_[i] = mask.depth_[p] + 1;
    }
    row[i / 64] |= uint64_t{1} << (i % 64);
  }
  return mask;
}

}  // namespace verifyd
