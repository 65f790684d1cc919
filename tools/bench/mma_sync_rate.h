// The mma.sync ceiling (SPEC §5, the portable kernel's floor): chains of mma.sync m16n8k16 bf16
// with fp32 accumulation on every SM, with B from shared memory by ldmatrix.x4 at addresses that
// do not move with the loop (so ptxas may hoist them: plans/0034 counted one per 16 mma), or with
// both operands in registers (the tensor pipe alone). The bench takes the faster as the floor.
#pragma once

#include <cuda_runtime_api.h>

namespace verifyd::bench {

enum class MmaOperands { kLdmatrixB, kRegisters };

// FLOPs one launch performs: grid x warps x iters x kMmaPerIter x 4096.
double MmaSyncRateFlops(int grid, int warps_per_cta, int iters);

// One CTA of `warps_per_cta` warps per block, `grid` blocks; `sink` (device, grid * warps floats)
// keeps the accumulators live.
cudaError_t LaunchMmaSyncRate(MmaOperands operands, int grid, int warps_per_cta, int iters,
                              float* sink, cudaStream_t stream);

}  // namespace verifyd::bench
