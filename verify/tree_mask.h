// TreeMask: the ancestor-or-self relation of a draft tree as bitmasks (SPEC §1).
//
// Row i has words_per_row() uint64 words; bit j of row i (word j/64, bit j%64) is set when
// node j is node i itself or one of its ancestors. O(Q^2) bits, never O(Q*L): prefix columns are
// always visible and need no mask. The same row layout is what the GPU kernels read.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace verifyd {

class TreeMask {
 public:
  // Validates parents (CheckParents, verify/tree_parents.h) and builds the ancestor sets.
  static absl::StatusOr<TreeMask> FromParents(absl::Span<const int32_t> parents, int max_nodes,
                                              const char* field = "parents");

  static int WordsPerRow(int num_nodes) { return (num_nodes + 63) / 64; }

  int num_nodes() const { return num_nodes_; }
  int words_per_row() const { return words_per_row_; }
  // True when node i sees node j (j == i or j an ancestor of i).
  bool Visible(int i, int j) const {
    return (bits_[static_cast<size_t>(i) * words_per_row_ + j / 64] >> (j % 64)) & 1u;
  }
  const uint64_t* row(int i) const {
    return bits_.data() + static_cast<size_t>(i) * words_per_row_;
  }
  // [num_nodes][words_per_row] words, row-major.
  const std::vector<uint64_t>& bits() const { return bits_; }
  // Depth of each node (roots have depth 0).
  const std::vector<int32_t>& depth() const { return depth_; }

 private:
  int num_nodes_ = 0;
  int words_per_row_ = 0;
  std::vector<uint64_t> bits_;
  std::vector<int32_t> depth_;
};

}  // namespace verifyd
