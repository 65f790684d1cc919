// The naive verify kernel: the on-GPU oracle. One CTA per (query row, head), fp32 scalar
// arithmetic, three plain passes over the visible columns (max and sum, then probabilities times
// values), no tensor cores, no tiling tricks: slow and obviously the formula of SPEC §1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "kernels/mla_verify_kernels.h"
#include "kernels/tree_visibility.cuh"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr int kNaiveThreads = 128;
static_assert(kVDim == 4 * kNaiveThreads, "each thread owns 4 value dimensions");

__device__ float Bf16(bf16_bits b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

// Element d of the pool's row at `slot`: a bf16 value, or an fp8 pool's dequantized one (its e4m3
// value x its group's scale in float32, verify/kv_fp8_layout.h; the rope values are bf16).
__device__ float KvValue(const VerifyProblem& pr, int32_t slot, int d) {
  if (pr.kv_fp8 == nullptr) return Bf16(pr.kv[static_cast<int64_t>(slot) * kKvDim + d]);
  const uint8_t* row = pr.kv_fp8 + static_cast<int64_t>(slot) * kFp8RowBytes;
  if (d >= kVDim) {
    const bf16_bits rope = static_cast<bf16_bits>(row[kFp8RopeOffset + 2 * (d - kVDim)] |
                                                  row[kFp8RopeOffset + 2 * (d - kVDim) + 1] << 8);
    return Bf16(rope);
  }
  const __half_raw h = __nv_cvt_fp8_to_halfraw(row[d], __NV_E4M3);
  const float scale = reinterpret_cast<const float*>(row + kFp8ScalesOffset)[d / kFp8GroupSize];
  return __half2float(__half(h)) * scale;
}

__device__ float Dot(const float* q, const VerifyProblem& pr, int32_t slot) {
  float acc = 0.f;
  if (pr.kv_fp8 != nullptr) {
    for (int d = 0; d < kKvDim; ++d) acc = fmaf(q[d], KvValue(pr, slot, d), acc);
    return acc;
  }
  const bf16_bits* k = pr.kv + static_cast<int64_t>(slot) * kKvDim;
  for (int chunk = 0; chunk < kKvDim / 8; ++chunk) {
    const uint4 packed = reinterpret_cast<const uint4*>(k)[chunk];
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    for (int w = 0; w < 4; ++w) {
      acc = fmaf(q[chunk * 8 + 2 * w], __uint_as_float(words[w] << 16), acc);
      acc = fmaf(q[chunk * 8 + 2 * w + 1], __uint_as_float(words[w] & 0xffff0000u), acc);
    }
  }
  return acc;
}

__global__ void __launch_bounds__(kNaiveThreads) MlaVerifyNaiveKernel(VerifyProblem pr) {
  __shared__ float q[kKvDim];
  __shared__ float probs[kNaiveThreads];
  __shared__ float reduce_max[kNaiveThreads];
  __shared__ float reduce_sum[kNaiveThreads];
  const int row = blockIdx.x;  // = query node (global) * H + head
  const int node_global = row / pr.num_heads;
  int b = 0;
  while (pr.qo_indptr[b + 1] <= node_global) ++b;
  const int node = node_global - pr.qo_indptr[b];
  const int num_nodes = pr.qo_indptr[b + 1] - pr.qo_indptr[b];
  const int prefix_len = pr.prefix_len[b];
  const int cols = prefix_len + num_nodes;
  const int32_t* slots = pr.slots + pr.slot_indptr[b];
  const uint64_t* mask_rows = pr.mask_bits + pr.mask_indptr[b];
  const int words_per_row = (num_nodes + 63) / 64;
  for (int d = threadIdx.x; d < kKvDim; d += kNaiveThreads) {
    q[d] = Bf16(pr.q[static_cast<int64_t>(row) * kKvDim + d]) * pr.scale;
  }
  __syncthreads();

  float m = -INFINITY;
  float l = 0.f;
  for (int t = threadIdx.x; t < cols; t += kNaiveThreads) {
    if (!ColumnVisible(mask_rows, words_per_row, prefix_len, node, t)) continue;
    const float s = Dot(q, pr, slots[t]);
    const float new_m = fmaxf(m, s);
    l = l * expf(m - new_m) + expf(s - new_m);
    m = new_m;
  }
  reduce_max[threadIdx.x] = m;
  reduce_sum[threadIdx.x] = l;
  __syncthreads();
  if (threadIdx.x == 0) {
    float mm = -INFINITY;
    for (int i = 0; i < kNaiveThreads; ++i) mm = fmaxf(mm, reduce_max[i]);
    float ll = 0.f;
    for (int i = 0; i < kNaiveThreads; ++i) {
      if (reduce_sum[i] > 0.f) ll += reduce_sum[i] * expf(reduce_max[i] - mm);
    }
    reduce_max[0] = mm;
    reduce_sum[0] = ll;
  }
  __syncthreads();
  const float row_max = reduce_max[0];
  const float row_sum = reduce_sum[0];

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int d0 = threadIdx.x * 4;
  for (int base = 0; base < cols; base += kNaiveThreads) {
    const int t = base + threadIdx.x;
    float p = 0.f;
    if (t < cols && ColumnVisible(mask_rows, words_per_row, prefix_len, node, t)) {
      p = expf(Dot(q, pr, slots[t]) - row_max) / row_sum;
    }
    probs[threadIdx.x] = p;
    __syncthreads();
    for (int j = 0; j < kNaiveThreads && base + j < cols; ++j) {
      if (probs[j] == 0.f) continue;
      for (int i = 0; i < 4; ++i)
        acc[i] = fmaf(probs[j], KvValue(pr, slots[base + j], d0 + i), acc[i]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    pr.out[static_cast<int64_t>(row) * kVDim + d0 + i] =
        __bfloat16_as_ushort(__float2bfloat16_rn(acc[i]));
  }
  if (threadIdx.x == 0 && pr.lse != nullptr) pr.lse[row] = row_max + logf(row_sum);
}

}  // namespace

void LaunchNaiveKernel(const VerifyProblem& problem, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(problem.total_q) * problem.num_heads;
  if (rows == 0) return;
  MlaVerifyNaiveKernel<<<static_cast<unsigned>(rows), kNaiveThreads, 0, stream>>>(problem);
}

}  // namespace verifyd
