// The raw kernel entry points behind mla_verify_launch.h: no validation here, one function per
// kernel so each .cu file holds one kernel. Only the launcher and the benchmark call these.
// Each returns the launch's error. The flash kernels let their successor be scheduled early and
// are launched as usual; the combine waits for the grid before it and is launched programmatically
// when `programmatic` (compute capability >= 9; programmatic_launch.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/mla_verify_params.h"
#include "verify/bf16.h"

namespace verifyd {

inline constexpr int kFlashThreads = 256;

int FlashSmemBytes();
// The portable kernel's instance for bf16 rows, or (fp8_rows) for an fp8 pool's 656-byte rows.
const void* FlashKernelSymbol(bool fp8_rows = false);
// One CTA per work item (params.num_work), kFlashThreads threads, FlashSmemBytes() of shared
// memory; the fp8 instance where params.problem.kv_fp8 is set.
cudaError_t LaunchFlashKernel(const MlaVerifyParams& params, cudaStream_t stream);

// The Hopper (sm_90a, wgmma) flash kernel: same work items, partials and outputs as the portable
// one, kHopperFlashThreads threads and HopperFlashSmemBytes() (> 99 KB) of shared memory per CTA.
// Its machine code exists only for sm_90a: HopperFlashKernelSymbol() has no image elsewhere. The
// benchmark's instrumented builds of it (timeline, no gathers, no wgmma) live in tools/bench.
inline constexpr int kHopperFlashThreads = 256;
int HopperFlashSmemBytes();
// The instance for bf16 rows, or (fp8_rows) for an fp8 pool's 656-byte rows.
const void* HopperFlashKernelSymbol(bool fp8_rows = false);
// The fp8 instance where params.problem.kv_fp8 is set.
cudaError_t LaunchHopperFlashKernel(const MlaVerifyParams& params, cudaStream_t stream);

// One CTA per (combine item, row of its 64): merges the item's partials by LSE into out/lse.
cudaError_t LaunchCombineKernel(const MlaVerifyParams& params, bool programmatic,
                                cudaStream_t stream);

// One CTA per (query row, head) of the whole batch: fp32 scalar arithmetic, the on-GPU oracle.
void LaunchNaiveKernel(const VerifyProblem& problem, cudaStream_t stream);

// Copies rows[i][0:576] into kv[slots[i]][0:576] for i < num_rows; slots outside [0, num_slots) are
// skipped.
void LaunchKvSlotWriteKernel(bf16_bits* kv, int64_t num_slots, const bf16_bits* rows,
                             const int32_t* slots, int num_rows, cudaStream_t stream);

}  // namespace verifyd
