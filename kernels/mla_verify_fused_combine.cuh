// The split-KV combine fused into the end of the Hopper flash kernel, for plans whose every
// combine item has at least kFusedCombineMinSplits splits (mla_verify_kernels.h) (S1, S7, SH: 64-66): the split CTAs of a combine
// item merge its rows themselves, row r by the item's split r mod n (one or two rows each), as soon
// as the last of them has written its partial. What it saves against the combine kernel: the
// second kernel's wait for the whole flash grid to end and be flushed, and its own fill and drain
// (plans/0004: the combine kernel added ~4.9 us to S1's 49 us flash kernel).
//
// No grid barrier and no cooperative launch, so it holds wherever the CTAs do not all fit at once
// (an MPS client with an active-thread limit): a CTA waits for its item's other splits only when
// every one of them has started (each announces itself first thing), so every CTA it waits for
// holds an SM and will finish. One that finds a split not yet started waits for nobody: it marks
// its rows as left and exits, and the item's last split to arrive, which needs to wait for nobody,
// merges them. So the worst case is fewer merging CTAs, never a deadlock.
//
// The handshake words of combine item i (params.combine_sync, zero between launches: PackPlan
// writes zeros and each launch's last arrival puts them back):
//   [4i] started, [4i + 1] arrived, [4i + 2] generation (moves by one per launch; waiters watch
//   it), [4i + 3] splits that left their rows to the last; then one word per partial: 1 where that
//   split left its rows.
//
// A row's merge (the combine kernel's math, mla_verify_combine.cu): the CTA's 256 threads own two
// dims each and walk every split, all of a batch's loads issued before any is used (one L2 round
// trip per batch of 72 splits), no shared memory and no barrier (a two-group form with a
// shared-memory exchange, inlined here, made ptxas spill inside the tile loop).
#pragma once

#include <cstdint>

#include <cmath>

#include "kernels/mla_verify_mma.cuh"
#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_params.h"

namespace verifyd::fused_combine {

static_assert(kFusedCombineMinSplits * 2 >= kFlashBlockRows, "at most two rows per split CTA");
inline constexpr int kThreads = kVDim / 2;  // two dims each
inline constexpr int kBatch = 72;

__device__ __forceinline__ uint32_t LdAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t LdRelaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void StRelaxed(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t AddAcqRel(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(p), "r"(v)
               : "memory");
  return old;
}
__device__ __forceinline__ void AddRelaxed(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void AddRelease(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// First thing in a split CTA of a fused plan: this split has started (and so will finish).
// (Thread 0 reads its work item's combine index itself: the flash kernel keeps no register for it.)
__device__ __forceinline__ void AnnounceStart(const MlaVerifyParams& params) {
  if (params.fused_combine != FusedCombine::kOff && threadIdx.x == 0) {
    const int combine = params.work[blockIdx.x].combine;
    if (combine >= 0) AddRelaxed(params.combine_sync + 4 * combine, 1);
  }
}

// Row r of combine item `item` by the CTA's kThreads threads: O = sum_s w_s O_s, w_s = exp(lse_s -
// max) / sum exp(lse - max), LSE = max + ln sum; a split with lse = -inf weighs 0. The partials
// are read past L1 (other CTAs wrote them during this kernel).
__device__ __forceinline__ void MergeRow(const MlaVerifyParams& params, const CombineItem& item,
                                         int r) {
  const VerifyProblem& pr = params.problem;
  const int q_begin = pr.qo_indptr[item.seq];
  const int seq_rows = (pr.qo_indptr[item.seq + 1] - q_begin) * pr.num_heads;
  if (item.row_begin + r >= seq_rows) return;
  const int n = item.num_splits;
  const float* lse =
      params.partial_lse + static_cast<int64_t>(item.partial_begin) * kFlashBlockRows + r;
  const uint32_t* partial =  // 2 bf16 dims per word
      reinterpret_cast<const uint32_t*>(
          params.partial_o +
          (static_cast<int64_t>(item.partial_begin) * kFlashBlockRows + r) * kVDim) +
      threadIdx.x;
  constexpr int64_t kSplitStride = int64_t{kFlashBlockRows} * kVDim / 2;  // words per partial
  float m = -INFINITY, t = 0.f, acc0 = 0.f, acc1 = 0.f;
  for (int s0 = 0; s0 < n; s0 += kBatch) {
    float w[kBatch];
    uint32_t x[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const bool in = s0 + k < n;
      w[k] = in ? __ldcg(lse + (s0 + k) * kFlashBlockRows) : -INFINITY;
      x[k] = in ? __ldcg(partial + (s0 + k) * kSplitStride) : 0u;
    }
    float m_new = m;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) m_new = fmaxf(m_new, w[k]);
    if (m_new == -INFINITY) continue;  // no split of this batch saw a column of the row
    const float f = expf(m - m_new);   // m = -inf -> 0
    t *= f;
    acc0 *= f;
    acc1 *= f;
    m = m_new;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const float e = expf(w[k] - m);
      t += e;
      acc0 += e * __uint_as_float(x[k] << 16);
      acc1 += e * __uint_as_float(x[k] & 0xffff0000u);
    }
  }
  const float inv_total = 1.f / t;  // t >= 1: the row's largest split weighs exp(0)
  const int64_t row = static_cast<int64_t>(q_begin) * pr.num_heads + item.row_begin + r;
  reinterpret_cast<uint32_t*>(pr.out + row * kVDim)[threadIdx.x] =
      mma::PackBf16x2(acc0 * inv_total, acc1 * inv_total);
  if (threadIdx.x == 0 && pr.lse != nullptr) pr.lse[row] = m + logf(t);
}

// The rows split `split` of `item` owns: r = split, split + n, ... < 64.
__device__ __forceinline__ void MergeRowsOf(const MlaVerifyParams& params, const CombineItem& item,
                                            int split) {
  for (int r = split; r < kFlashBlockRows; r += item.num_splits) MergeRow(params, item, r);
}

// Every thread of a split CTA of a fused plan, once this CTA has written its partial's LSEs and
// issued the bulk copies of its rows (committed, not yet waited for). `scratch`: shared memory of
// this CTA free from here on, 16 bytes + one per split of the item.
// (The work item is read again here rather than kept in registers through the flash kernel's tile
// loop, which has none to spare.)
__device__ __forceinline__ void MergeAfterPartial(const MlaVerifyParams& params, uint8_t* scratch) {
  const FlashWorkItem item = params.work[blockIdx.x];
  const CombineItem citem = params.combine[item.combine];
  const int split = item.partial - citem.partial_begin;
  const int n = citem.num_splits;
  uint32_t* sync = params.combine_sync + 4 * item.combine;
  uint32_t* left = params.combine_sync + 4 * params.num_combine + citem.partial_begin;
  volatile int* role_word = reinterpret_cast<volatile int*>(scratch);
  volatile uint8_t* left_here = scratch + 16;
  // This thread's bulk copies of partial rows landed and, with its LSE stores, ordered before
  // thread 0 announces the partial.
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool all_started =
        params.fused_combine == FusedCombine::kOn && LdAcquire(sync) == static_cast<uint32_t>(n);
    if (!all_started) {
      StRelaxed(left + split, 1);
      AddRelaxed(sync + 3, 1);
    }
    const uint32_t generation = LdRelaxed(sync + 2);  // before arriving: the last bumps it after
    const bool last = AddAcqRel(sync + 1, 1) == static_cast<uint32_t>(n - 1);
    int role = all_started ? 1 : 0;
    if (last) {
      // Every split has read `started` and arrived: the words go back to zero for the next launch.
      role = LdRelaxed(sync + 3) != 0 ? 3 : 2;  // 3: some split left its rows
      StRelaxed(sync, 0);
      StRelaxed(sync + 1, 0);
      StRelaxed(sync + 3, 0);
      AddRelease(sync + 2, 1);
    } else if (all_started) {
      while (LdAcquire(sync + 2) == generation) __nanosleep(32);
    }
    *role_word = role;
  }
  __syncthreads();
  const int role = *role_word;
  if (role == 0) return;
  MergeRowsOf(params, citem, split);
  if (role == 3) {
    // Rare (splits that did not all fit at once): the rows of every split that left them.
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
      left_here[s] = s != split && __ldcg(left + s) != 0;
      left[s] = 0;
    }
    __syncthreads();
    for (int s = 0; s < n; ++s) {
      if (left_here[s]) MergeRowsOf(params, citem, s);
    }
  }
}

}  // namespace verifyd::fused_combine
