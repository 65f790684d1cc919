// Which KV column a query row may see (SPEC §1), shared by the flash and the naive kernels so that
// both read the same TreeMask bits the same way.
#pragma once

#include <cstdint>

namespace verifyd {

// Column t of a sequence with prefix length L: t < L is a committed token (always visible);
// t = L + j is tree node j, visible to `node` when bit j of the node's mask row is set.
__device__ __forceinline__ bool ColumnVisible(const uint64_t* mask_rows, int words_per_row,
                                              int prefix_len, int node, int t) {
  if (t < prefix_len) return true;
  const int j = t - prefix_len;
  return (mask_rows[static_cast<int64_t>(node) * words_per_row + (j >> 6)] >> (j & 63)) & 1u;
}

}  // namespace verifyd
