// The split-KV combine: for each row, merges the partial results of its splits by their LSE.
//   O = sum_s w_s O_s with w_s = exp(lse_s - max) / sum_s' exp(lse_s' - max);  LSE = max + ln sum
//   exp(...)
// Each O_s is already normalised by its own softmax sum, so the weights alone rescale it.
// A split that saw no column of a row (a tree-only split past the row's ancestors) has lse = -inf
// and weight 0; every row has one split that sees the node itself, so max is finite.
//
// One CTA per (combine item, row), in one of two shapes picked by the plan's largest split count:
// - few splits (< kManySplits, e.g. S2-S5's 4-14): 128 threads, thread t owns dims 4t .. 4t+3 and
//   walks every split;
// - many splits (S1/S7's 66): 512 threads in 4 groups of 128; group k walks the splits k, k + 4,
//   ... and the 4 groups' merge states meet in shared memory, added in group order.
// The partials are bf16 (mla_verify_params.h); the merge runs in fp32.
// The kernel is latency-bound (S1: 128 rows x 66 splits x 1 KB, in L2), so a thread issues the
// LSE and partial loads of a whole batch (kBatch splits; S1-S7 need one batch) before it uses any,
// and keeps a running (max, sum, acc) merge state instead of reducing the LSEs over the CTA first:
// one round trip to L2 per batch, no block reduction (plans/0004, v15: S1 -1.0 us, S2 -2.2 us).
// Bulk copies (TMA) of the partial rows into shared memory were 1.5 us slower at S1 (v15b).
// Both add in a fixed order: the same bits on every run.
// Launched programmatically behind the flash kernel (programmatic_launch.cuh): it waits for the
// flash grid before its first read.
#include <cmath>

#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_mma.cuh"
#include "kernels/programmatic_launch.cuh"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr int kDimThreads = kVDim / 4;  // one float4 of the row each
constexpr int kManySplits = 32;

// The merge state of a set of splits: m = their largest LSE, t = sum exp(lse - m),
// acc = sum exp(lse - m) O_s. m = -inf while no split with a finite LSE has been seen.
struct MergeState {
  float m = -INFINITY;
  float t = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
};

__device__ __forceinline__ float4 Bf16x4ToFloat4(uint2 v) {
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                     __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
}

// Rescales state to the max m_new (>= state.m, finite).
__device__ __forceinline__ void Rebase(MergeState& state, float m_new) {
  const float f = expf(state.m - m_new);  // state.m = -inf -> 0: an empty state stays empty
  state.t *= f;
  state.acc.x *= f;
  state.acc.y *= f;
  state.acc.z *= f;
  state.acc.w *= f;
  state.m = m_new;
}

__device__ __forceinline__ void AddScaled(float4& acc, float f, const float4& x) {
  acc.x += f * x.x;
  acc.y += f * x.y;
  acc.z += f * x.z;
  acc.w += f * x.w;
}

// The groups' merge states to one (in group order), then the row out: O = acc / t, LSE = m + ln t.
template <int kGroups>
struct GroupExchange {
  float4 acc[kGroups > 1 ? kGroups - 1 : 1][kDimThreads];
  float m[kGroups > 1 ? kGroups - 1 : 1];
  float t[kGroups > 1 ? kGroups - 1 : 1];
};

template <int kGroups>
__device__ __forceinline__ void FinishRow(MergeState state, int group, int dim4,
                                          const MlaVerifyParams& params, const CombineItem& item,
                                          int r, int q_begin, GroupExchange<kGroups>& shared) {
  if (kGroups > 1) {
    if (group > 0) {
      shared.acc[group - 1][dim4] = state.acc;
      if (dim4 == 0) {
        shared.m[group - 1] = state.m;
        shared.t[group - 1] = state.t;
      }
    }
    __syncthreads();
    if (group > 0) return;
    float m_all = state.m;
#pragma unroll
    for (int g = 0; g < kGroups - 1; ++g) m_all = fmaxf(m_all, shared.m[g]);
    Rebase(state, m_all);  // finite: every row has a split that sees the node itself
#pragma unroll
    for (int g = 0; g < kGroups - 1; ++g) {
      const float f = expf(shared.m[g] - m_all);
      state.t += f * shared.t[g];
      AddScaled(state.acc, f, shared.acc[g][dim4]);
    }
  }
  const VerifyProblem& pr = params.problem;
  const float inv_total = 1.f / state.t;
  const int64_t row = static_cast<int64_t>(q_begin) * pr.num_heads + item.row_begin + r;
  uint2 packed;
  packed.x = mma::PackBf16x2(state.acc.x * inv_total, state.acc.y * inv_total);
  packed.y = mma::PackBf16x2(state.acc.z * inv_total, state.acc.w * inv_total);
  reinterpret_cast<uint2*>(pr.out + row * kVDim)[dim4] = packed;
  if (dim4 == 0 && pr.lse != nullptr) pr.lse[row] = state.m + logf(state.t);
}

// Small batches go with many CTAs per SM (S5: 2048 CTAs of 128 threads): at most 64 registers.
template <int kGroups, int kBatch>
__global__ void __launch_bounds__(kDimThreads* kGroups, kBatch <= 8 ? 8 : 1)
    MlaVerifyCombineKernel(MlaVerifyParams params) {
  // Launched programmatically behind the flash kernel (programmatic_launch.cuh): its partials are
  // complete and visible only after this wait.
  pdl::WaitForPriorGrid();
  pdl::AllowDependentLaunch();
  __shared__ GroupExchange<kGroups> shared;
  const CombineItem item = params.combine[blockIdx.x];
  const int r = blockIdx.y;
  const VerifyProblem& pr = params.problem;
  const int q_begin = pr.qo_indptr[item.seq];
  const int seq_rows = (pr.qo_indptr[item.seq + 1] - q_begin) * pr.num_heads;
  if (item.row_begin + r >= seq_rows) return;  // the whole CTA leaves: no barrier is skipped
  const int n = item.num_splits;
  const int group = threadIdx.x / kDimThreads;
  const int dim4 = threadIdx.x % kDimThreads;
  const float* lse =
      params.partial_lse + static_cast<int64_t>(item.partial_begin) * kFlashBlockRows + r;
  const uint2* partial =  // 4 bf16 dims per uint2
      reinterpret_cast<const uint2*>(
          params.partial_o +
          (static_cast<int64_t>(item.partial_begin) * kFlashBlockRows + r) * kVDim) +
      dim4;
  constexpr int64_t kSplitStride = int64_t{kFlashBlockRows} * kVDim / 4;  // uint2s per partial

  // Every thread of a group reads the same LSEs, so the group's threads hold the same m and t.
  MergeState state;
  for (int s0 = group; s0 < n; s0 += kGroups * kBatch) {
    float w[kBatch];
    uint2 x[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int s = s0 + k * kGroups;
      const bool in = s < n;
      w[k] = in ? lse[s * kFlashBlockRows] : -INFINITY;
      x[k] = in ? partial[s * kSplitStride] : make_uint2(0u, 0u);
    }
    float m_new = state.m;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) m_new = fmaxf(m_new, w[k]);
    if (m_new == -INFINITY) continue;  // no split of this batch saw a column of the row
    Rebase(state, m_new);
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const float e = expf(w[k] - m_new);  // -inf (absent or empty split) -> 0
      state.t += e;
      AddScaled(state.acc, e, Bf16x4ToFloat4(x[k]));
    }
  }
  FinishRow<kGroups>(state, group, dim4, params, item, r, q_begin, shared);
}

}  // namespace

cudaError_t LaunchCombineKernel(const MlaVerifyParams& params, bool programmatic,
                                cudaStream_t stream) {
  if (params.num_combine == 0) return cudaSuccess;
  const dim3 grid(params.num_combine, kFlashBlockRows);
  auto launch = [&](auto kernel, int threads) {
    return pdl::LaunchMaybeProgrammatic(kernel, grid, dim3(threads), 0, stream, programmatic,
                                        params);
  };
  if (params.max_splits >= kManySplits) {
    // 17 splits per group at S1/S7 (66 splits): one batch.
    return launch(&MlaVerifyCombineKernel<4, 20>, kDimThreads * 4);
  }
  if (params.max_splits > 8) return launch(&MlaVerifyCombineKernel<1, 16>, kDimThreads);
  if (params.max_splits > 4) return launch(&MlaVerifyCombineKernel<1, 8>, kDimThreads);
  // Many combine items with few splits (S5: 2048 CTAs of 4 splits): a batch no larger than the
  // splits keeps the registers (48) low, so more CTAs are resident at once.
  return launch(&MlaVerifyCombineKernel<1, 4>, kDimThreads);
}

}  // namespace verifyd
