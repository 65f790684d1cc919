// The combine, fused into the end of a flash kernel launched cooperatively (every CTA of the plan
// resident at once; mla_verify_launch.cu decides). After a CTA has written its split partials, a
// grid barrier, then the CTAs share the combine's rows: CTA b merges rows b, b + grid, ... of the
// plan's combine items (CombineRow, two groups of 128 threads). What it saves, against the combine
// kernel after the flash kernel: the second launch and its wait for the last flash CTA to leave
// the SMs (the flash CTAs hold every register, so nothing of the combine can start earlier; PDL
// gained nothing, plans/0004 v10), and the combine's own fill and drain.
#pragma once

#include <cooperative_groups.h>

#include "kernels/mla_verify_combine_row.cuh"
#include "kernels/mla_verify_params.h"

namespace verifyd::combine {

inline constexpr int kFusedThreads = 2 * kDimThreads;
// One batch per group covers up to 2 x 36 splits (S1/S7/SH plan 64-66).
inline constexpr int kFusedBatch = 36;
inline constexpr int kFusedSmemBytes = sizeof(GroupExchange<2>);

// Every thread of every CTA calls this once its partials (and LSEs) are written and visible to
// the generic proxy. smem: kFusedSmemBytes of this CTA's shared memory, free from here on.
__device__ __forceinline__ void FusedCombine(const MlaVerifyParams& params, void* smem) {
  cooperative_groups::this_grid().sync();  // every split's partial is written
  auto& shared = *static_cast<GroupExchange<2>*>(smem);
  const int units = params.num_combine * kFlashBlockRows;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    CombineRow<2, kFusedBatch>(params, params.combine[u / kFlashBlockRows], u % kFlashBlockRows,
                               threadIdx.x, shared);
    __syncthreads();  // `shared` is reused by the next row
  }
}

}  // namespace verifyd::combine
