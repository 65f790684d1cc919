// The split-KV combine kernel: one CTA per (combine item, row); the arithmetic of a row is
// mla_verify_combine_row.cuh (shared with the flash kernels' fused combine). Two CTA shapes, picked
// by the plan's largest split count:
// - few splits (< kManySplits, e.g. S2-S5's 4-14): 128 threads, one group walks every split;
// - many splits (S1/S7's 66): 512 threads in 4 groups of 128.
// The flash kernels merge the splits themselves when a plan's CTAs can all be resident at once
// (mla_verify_launch.cu); this kernel serves the other plans and the benchmark's breakdown.
// Bulk copies (TMA) of the partial rows into shared memory were 1.5 us slower at S1 (v15b).
#include "kernels/mla_verify_combine_row.cuh"
#include "kernels/mla_verify_kernels.h"

namespace verifyd {
namespace {

using combine::kDimThreads;
constexpr int kManySplits = 32;

// Small batches go with many CTAs per SM (S5: 2048 CTAs of 128 threads): at most 64 registers.
template <int kGroups, int kBatch>
__global__ void __launch_bounds__(kDimThreads* kGroups, kBatch <= 8 ? 8 : 1)
    MlaVerifyCombineKernel(MlaVerifyParams params) {
  __shared__ combine::GroupExchange<kGroups> shared;
  combine::CombineRow<kGroups, kBatch>(params, params.combine[blockIdx.x], blockIdx.y,
                                       threadIdx.x, shared);
}

}  // namespace

void LaunchCombineKernel(const MlaVerifyParams& params, cudaStream_t stream) {
  if (params.num_combine == 0) return;
  const dim3 grid(params.num_combine, kFlashBlockRows);
  if (params.max_splits >= kManySplits) {
    // 17 splits per group at S1/S7 (66 splits): one batch.
    MlaVerifyCombineKernel<4, 20><<<grid, kDimThreads * 4, 0, stream>>>(params);
  } else if (params.max_splits > 8) {
    MlaVerifyCombineKernel<1, 16><<<grid, kDimThreads, 0, stream>>>(params);
  } else if (params.max_splits > 4) {
    MlaVerifyCombineKernel<1, 8><<<grid, kDimThreads, 0, stream>>>(params);
  } else {
    // Many combine items with few splits (S5: 2048 CTAs of 4 splits): a batch no larger than the
    // splits keeps the registers (48) low, so more CTAs are resident at once.
    MlaVerifyCombineKernel<1, 4><<<grid, kDimThreads, 0, stream>>>(params);
  }
}

}  // namespace verifyd
