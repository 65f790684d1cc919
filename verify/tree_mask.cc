#include "verify/tree_mask.h"

#include <cstddef>

#include "absl/status/status.h"
#include "base/status_macros.h"
#include "verify/tree_parents.h"

namespace verifyd {

absl::StatusOr<TreeMask> TreeMask::FromParents(absl::Span<const int32_t> parents, int max_nodes,
                                               const char* field) {
  VERIFYD_RETURN_IF_ERROR(CheckParents(parents, max_nodes, field));
  const size_t n = parents.size();

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
