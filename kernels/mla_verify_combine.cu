// The split-KV combine: for each row, merges the partial results of its splits by their LSE.
//   O = sum_s w_s O_s with w_s = exp(lse_s - max) / sum_s' exp(lse_s' - max);  LSE = max + ln sum
//   exp(...)
// Each O_s is already normalised by its own softmax sum, so the weights alone rescale it.
// A split that saw no column of a row (a tree-only split past the row's ancestors) has lse = -inf
// and weight 0; every row has one split that sees the node itself, so max is finite.
//
// One CTA per (combine item, row), in one of two shapes picked by the plan's largest split count
// (measured on the H200, plans/0004-kernel.md v10):
// - few splits (< kManySplits, e.g. S2-S5's 4-14): 128 threads, thread t owns dims 4t .. 4t+3;
//   every thread reads the row's LSEs itself (broadcast loads, no barrier) and issues kBatch
//   partial loads before it uses any.
// - many splits (S1/S7's 66): 512 threads in 4 groups of 128; group k walks the splits k, k + 4,
//   ...; the LSE max and sum are spread over the threads (block reductions) and the 4 group sums
//   are added in shared memory in group order. The kernel is latency-bound (S1: 128 rows x 66
//   splits x 2 KB, in L2): 4 x kBatch splits of a row are in flight at once.
// Both add in a fixed order: the same bits on every run.
#include <cmath>

#include "kernels/mla_dims.h"
#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_mma.cuh"

namespace verifyd {
namespace {

constexpr int kDimThreads = kVDim / 4;  // one float4 of the row each
constexpr int kManySplits = 32;
constexpr int kBatch = 8;

// Reduces one value per thread over the CTA; every thread gets the result. The order is fixed,
// so the result is the same bits on every run.
template <int kWarps, typename Op>
__device__ __forceinline__ float BlockReduce(float x, float* scratch, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) scratch[warp] = x;
  __syncthreads();
  float r = scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) r = op(r, scratch[w]);
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

template <int kGroups>
__global__ void __launch_bounds__(kDimThreads* kGroups)
    MlaVerifyCombineKernel(MlaVerifyParams params) {
  constexpr int kThreads = kDimThreads * kGroups;
  constexpr int kWarps = kThreads / 32;
  __shared__ float scratch[kWarps];
  __shared__ float4 group_sum[kGroups > 1 ? kGroups - 1 : 1][kDimThreads];
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
  const float4* partial =
      reinterpret_cast<const float4*>(
          params.partial_o +
          (static_cast<int64_t>(item.partial_begin) * kFlashBlockRows + r) * kVDim) +
      dim4;
  constexpr int64_t kSplitStride = int64_t{kFlashBlockRows} * kVDim / 4;  // float4s per partial

  float max_lse = -INFINITY;
  float total = 0.f;
  if (kGroups == 1) {
    for (int s = 0; s < n; ++s) max_lse = fmaxf(max_lse, lse[s * kFlashBlockRows]);
    for (int s = 0; s < n; ++s) total += expf(lse[s * kFlashBlockRows] - max_lse);
  } else {
    for (int s = threadIdx.x; s < n; s += kThreads) {
      max_lse = fmaxf(max_lse, lse[s * kFlashBlockRows]);
    }
    max_lse = BlockReduce<kWarps>(max_lse, scratch, [](float a, float b) { return fmaxf(a, b); });
    for (int s = threadIdx.x; s < n; s += kThreads) {
      total += expf(lse[s * kFlashBlockRows] - max_lse);
    }
    total = BlockReduce<kWarps>(total, scratch, [](float a, float b) { return a + b; });
  }
  const float inv_total = 1.f / total;

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = group; s0 < n; s0 += kGroups * kBatch) {
    float w[kBatch];
    float4 x[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int s = s0 + k * kGroups;
      const bool in = s < n;
      w[k] = in ? lse[s * kFlashBlockRows] : -INFINITY;
      x[k] = in ? partial[s * kSplitStride] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const float wk = expf(w[k] - max_lse) * inv_total;  // -inf (absent or empty split) -> 0
      acc.x += wk * x[k].x;
      acc.y += wk * x[k].y;
      acc.z += wk * x[k].z;
      acc.w += wk * x[k].w;
    }
  }
  if (kGroups > 1) {
    if (group > 0) group_sum[group - 1][dim4] = acc;
    __syncthreads();
    if (group > 0) return;
  }
#pragma unroll
  for (int k = 0; k < kGroups - 1; ++k) {
    const float4 g = group_sum[k][dim4];
    acc.x += g.x;
    acc.y += g.y;
    acc.z += g.z;
    acc.w += g.w;
  }
  const int64_t row = static_cast<int64_t>(q_begin) * pr.num_heads + item.row_begin + r;
  uint2 packed;
  packed.x = mma::PackBf16x2(acc.x, acc.y);
  packed.y = mma::PackBf16x2(acc.z, acc.w);
  reinterpret_cast<uint2*>(pr.out + row * kVDim)[dim4] = packed;
  if (dim4 == 0 && pr.lse != nullptr) pr.lse[row] = max_lse + logf(total);
}

}  // namespace

void LaunchCombineKernel(const MlaVerifyParams& params, cudaStream_t stream) {
  if (params.num_combine == 0) return;
  const dim3 grid(params.num_combine, kFlashBlockRows);
  if (params.max_splits >= kManySplits) {
    MlaVerifyCombineKernel<4><<<grid, kDimThreads * 4, 0, stream>>>(params);
  } else {
    MlaVerifyCombineKernel<1><<<grid, kDimThreads, 0, stream>>>(params);
  }
}

}  // namespace verifyd
