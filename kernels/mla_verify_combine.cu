// The split-KV combine: for each row, merges the partial results of its splits by their LSE.
//   O = sum_s w_s O_s with w_s = exp(lse_s - max) / sum_s' exp(lse_s' - max);  LSE = max + ln sum
//   exp(...)
// Each O_s is already normalised by its own softmax sum, so the weights alone rescale it.
// A split that saw no column of a row (a tree-only split past the row's ancestors) has lse = -inf
// and weight 0; every row has one split that sees the node itself, so max is finite.
#include <cmath>

#include "kernels/mla_dims.h"
#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_mma.cuh"

namespace verifyd {
namespace {

constexpr int kCombineThreads = kVDim / 4;

__global__ void __launch_bounds__(kCombineThreads) MlaVerifyCombineKernel(MlaVerifyParams params) {
  const CombineItem item = params.combine[blockIdx.x];
  const int r = blockIdx.y;
  const VerifyProblem& pr = params.problem;
  const int q_begin = pr.qo_indptr[item.seq];
  const int seq_rows = (pr.qo_indptr[item.seq + 1] - q_begin) * pr.num_heads;
  if (item.row_begin + r >= seq_rows) return;
  const float* lse =
      params.partial_lse + static_cast<int64_t>(item.partial_begin) * kFlashBlockRows + r;
  float max_lse = -INFINITY;
  for (int s = 0; s < item.num_splits; ++s) max_lse = fmaxf(max_lse, lse[s * kFlashBlockRows]);
  float total = 0.f;
  for (int s = 0; s < item.num_splits; ++s) total += expf(lse[s * kFlashBlockRows] - max_lse);
  const float inv_total = 1.f / total;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < item.num_splits; ++s) {
    const float w = expf(lse[s * kFlashBlockRows] - max_lse) * inv_total;
    const float4 x = reinterpret_cast<const float4*>(
        params.partial_o +
        (static_cast<int64_t>(item.partial_begin + s) * kFlashBlockRows + r) * kVDim)[threadIdx.x];
    acc.x += w * x.x;
    acc.y += w * x.y;
    acc.z += w * x.z;
    acc.w += w * x.w;
  }
  const int64_t row = static_cast<int64_t>(q_begin) * pr.num_heads + item.row_begin + r;
  uint2 packed;
  packed.x = mma::PackBf16x2(acc.x, acc.y);
  packed.y = mma::PackBf16x2(acc.z, acc.w);
  reinterpret_cast<uint2*>(pr.out + row * kVDim)[threadIdx.x] = packed;
  if (threadIdx.x == 0 && pr.lse != nullptr) pr.lse[row] = max_lse + logf(total);
}

}  // namespace

void LaunchCombineKernel(const MlaVerifyParams& params, cudaStream_t stream) {
  if (params.num_combine == 0) return;
  MlaVerifyCombineKernel<<<dim3(params.num_combine, kFlashBlockRows), kCombineThreads, 0, stream>>>(
      params);
}

}  // namespace verifyd
