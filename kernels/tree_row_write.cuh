// The bf16 tree-KV write's device part as blocks of a launch it rides in (TreeRowWriteArgs,
// kernels/tree_kv_write.h). Math: kv[slots[r]][c] = rows[r][c]. Tiling: one 16-byte chunk (8 bf16)
// per thread, 72 chunks a row, block b taking chunks [256 b, 256 b + 256). Schedule: one pass,
// as many blocks as the rows need (TreeRowWriteBlocks). Shared memory: none.
#pragma once

#include <cstdint>

#include "kernels/tree_kv_write.h"
#include "verify/mla_dims.h"

namespace verifyd {

inline constexpr int kTreeRowChunks = kKvDim / 8;  // 16-byte chunks per row
inline constexpr int kTreeRowThreads = 256;        // the launch's block size

__host__ __device__ inline int TreeRowWriteBlocks(const TreeRowWriteArgs& t) {
  const int64_t chunks = int64_t{t.total_q} * kTreeRowChunks;
  return static_cast<int>((chunks + kTreeRowThreads - 1) / kTreeRowThreads);
}

__device__ __forceinline__ void TreeRowWriteBlock(const TreeRowWriteArgs& t, int block) {
  const int64_t chunk = int64_t{block} * kTreeRowThreads + threadIdx.x;
  if (chunk >= int64_t{t.total_q} * kTreeRowChunks) return;
  const int r = static_cast<int>(chunk / kTreeRowChunks);
  const int c = static_cast<int>(chunk % kTreeRowChunks);
  const int32_t slot = t.slots[r];
  if (slot < 0 || slot >= t.num_slots) return;
  reinterpret_cast<uint4*>(t.kv + int64_t{slot} * kKvDim)[c] =
      reinterpret_cast<const uint4*>(t.rows + int64_t{r} * kKvDim)[c];
}

}  // namespace verifyd
