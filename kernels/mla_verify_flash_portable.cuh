// The flash MLA tree-verify kernel, portable tensor-core path (mma.sync; sm_80, sm_90, sm_120 — the
// product's GPU, RTX PRO 6000 Blackwell: no wgmma, 101,376 bytes of shared memory per block).
//
// Math (SPEC §1). Rows r = node * H + head of one sequence; columns t = 0 .. L+Q-1 (prefix first,
// then tree nodes):
//   S[r, t] = scale * <q[r, 0:576], kv[slot(t), 0:576]>, -inf where node(r) cannot see t;
//   O[r, :] = softmax_t(S[r, :]) @ kv[slot(t), 0:512];   LSE[r] = ln sum_t exp(S[r, t]).
// Online softmax in fp32, in log2 units (scale folded with log2 e), 32 KV columns per tile.
//
// Tiling. One CTA = one work item: 64 rows of one sequence x a column range [col_begin, col_end)
// from the split planner; every head and node of the 64 rows shares each KV tile read.
//   per tile: S (64 x 32, k = 576) = 576 mma m16n8k16;  O += P V (64 x 512, k = 32) = 512 mma.
//
// Warps (8, 256 threads): warp w = (row group rg = w % 4, k group kg = w / 4), and the two warps
// of a row group (a pair) work on their 16 rows alone, so no phase of a tile waits for all 8 warps.
// - Registers: O (64 x 512 fp32) spread as 16 rows x 256 value columns per warp (kg's half: 128
//   registers); Q's latent part as mma A fragments, 16 rows x latent dims 256 kg .. 256 kg + 256
//   (64 registers). The 64 rope dims of Q stay in shared memory (two k-steps per warp).
// - S: each warp computes a partial S (16 x 32 over its 288 of the 576 dims), the pair swaps
//   partials through shared memory (a pair mbarrier, no CTA barrier), and both warps add them in
//   the same order (k group 0 first), so both hold the same bits of the whole 16 x 32 S: both run
//   the same online softmax on it and turn P into A fragments in registers (the accumulator layout
//   of two n-tiles is the A layout of one k-step), with no shared-memory round trip for P.
// - P V: each warp multiplies its own P (16 x 32) by V's columns of its half (32 x 256): V by
//   ldmatrix.trans, 256 B per mma.
//
// Schedule per tile j (each step a phase below):
//   1. wait for this thread's copies of tile j, CTA barrier: tile j is in for everyone, and every
//      warp has finished tile j-1, so the other buffer and the swap slots are free;
//   2. S partial (SPartial), its K fragments two steps ahead of their mma; the copies of tile j+1
//      into the other buffer ride between its mma, one row per warp every 8 of its 36 steps, and
//      the slot-table load for tile j+2 follows;
//   3. pair swap (PairSwap);  4. online softmax, P in registers (Softmax);  5. P V (AccumulatePv).
// The barrier is the only point all 8 warps meet; between two of them the pairs run apart. The
// reference maximum of a row moves only when a score passes it by 2^8 (Softmax), so O's 128
// registers are rescaled a few times per row, not at most tiles.
//
// Shared memory (100,384 B of the 101,376 B that sm_120 allows per block):
//   KV tiles  2 x 32 x 584 bf16, rows padded by 16 B so ldmatrix rows hit distinct banks; the
//             prologue stages the 64-row Q tile, the epilogue O, through the same bytes  74752 B
//   S swap    8 warps x 32 lanes x 16 fp32 (4 float4 per lane, lane-contiguous)        16384 B
//   Q rope    64 x 72 bf16 (padded)                                                     9216 B
//   pair mbarriers, 4 x 8 B                                                               32 B
//
// KV rows are gathered through the int32 slot table with 16-byte cp.async, warp w copying rows
// 4w .. 4w+3 of a tile; lane i holds the slot of column i. One-run and scattered tiles take the
// same path (scattered / contiguous 1.00, plans/0027). A column past col_end copies the last
// column's row, which the mask turns into P = 0, so a masked column never multiplies garbage
// (0 * NaN) into O.
//
// An fp8 pool (DeepSeek's 656-byte rows; the KvRows::kFp8 instance) changes the load stage only:
// each warp's raw rows land in the tail of its own rows' bytes of the next buffer and are widened
// there to bf16 during P V (mla_verify_kv_fp8_load.cuh: the math, the byte plan, the schedule), so
// S, softmax and P V read the same bf16 tile and the shared-memory plan is the same. Measured in
// plans/0032 (fp8 / bf16 1.07-1.10 on the H200: the widening's instructions, not bytes).
//
// Output: an item that covers all columns writes O (bf16) and the LSE directly; a split writes its
// O normalised by its own sum (bf16) plus its LSE, and mla_verify_combine.cu merges the splits. O
// is staged in the idle KV buffers and leaves as whole-row 16-byte coalesced stores.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/mla_verify_flash_common.cuh"
#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_kv_fp8_load.cuh"
#include "kernels/mla_verify_mma.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/tree_visibility.cuh"
#include "verify/mla_dims.h"

namespace verifyd::portable {

using flash::Exp2Ftz;
using flash::kFullMask;
using flash::kLog2e;
using flash::kRows;
using mma::CpAsync16;
using mma::CpAsyncCommit;
using mma::CpAsyncWaitAll;
using mma::LdMatrixX4;
using mma::LdMatrixX4Trans;
using mma::MmaBf16;
using mma::SmemAddr;

inline constexpr int kCols = kFlashBlockCols;
inline constexpr int kWarps = kFlashThreads / 32;
inline constexpr int kStride = kKvDim + 8;             // bf16 per padded shared row (1168 B)
inline constexpr int kChunksPerRow = kKvDim / 8;       // 16-byte chunks per KV row
inline constexpr int kNopeKSteps = kVDim / 16 / 2;     // latent k-steps per k group (registers)
inline constexpr int kRopeKSteps = kRopeDim / 16 / 2;  // rope k-steps per k group (shared memory)
inline constexpr int kRopeStride = kRopeDim + 8;
inline constexpr int kNTiles = kCols / 8;      // S n-tiles per warp
inline constexpr int kOTiles = kVDim / 2 / 8;  // O n-tiles per warp (its 256 columns)
inline constexpr int kKPrefetch = 2;           // S's K fragments in flight ahead of their mma

// The shared-memory plan; its size is the kernel's dynamic shared memory.
struct SharedPlan {
  bf16_bits kv[2][kCols * kStride];
  float4 s_swap[kWarps][kNTiles][32];
  bf16_bits q_rope[kRows * kRopeStride];
  uint64_t pair_barrier[4];
};
inline constexpr int kSmemBytes = sizeof(SharedPlan);
static_assert(kSmemBytes <= 101376, "sm_120 allows 101,376 bytes of shared memory per block");
static_assert(kRows * kStride * sizeof(bf16_bits) <= sizeof(SharedPlan::kv),
              "the Q staging tile must fit in the KV buffers");
static_assert(kRows * flash::kStageStride <= sizeof(SharedPlan::kv),
              "the staged O fits the KV buffers");
static_assert(kCols % kWarps == 0, "each warp copies whole rows of a tile");

// Portable mbarrier forms (sm_80+): init, arrive, and a test_wait spin (try_wait is sm_90+).
__device__ __forceinline__ void MbarrierInit(uint32_t addr, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarrierArrive(uint32_t addr) {
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared.b64 state, [%0];\n}\n" ::"r"(addr)
               : "memory");
}
__device__ __forceinline__ void MbarrierWait(uint32_t addr, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}

// Issues the cp.async copies of KV row r (column tile_col + r) of a tile into `dst`: lane i copies
// 16-byte chunks i, i + 32, i + 64 (< 72). my_slot = the slot of column tile_col + lane, loaded a
// tile ahead (TileSlot) so the gather never waits on the slot table's global-memory latency. A
// column past col_end copies the last column's row (TileSlot), real finite KV that the mask turns
// into P = 0: no copy needs zero-fill, and a row's three chunks are one pointer plus constant
// offsets (the first loader's per-chunk selects and zero-fill sizes were ~190 instructions a tile
// per warp, plans/0027).
__device__ __forceinline__ void LoadKvRow(const bf16_bits* kv, int my_slot, bf16_bits* dst, int r,
                                          int lane) {
  const int slot = __shfl_sync(kFullMask, my_slot, r);
  const bf16_bits* src = kv + static_cast<int64_t>(slot) * kKvDim + lane * 8;
  const uint32_t to = SmemAddr(dst + r * kStride + lane * 8);
  mma::CpAsync16Full(to, src);
  mma::CpAsync16Full(to + 512, src + 256);
  if (lane < kChunksPerRow - 64) mma::CpAsync16Full(to + 1024, src + 512);
}

// All 32 rows of a tile at once, warp w copying rows 4w .. 4w + 3 (the prologue's first tile; the
// loop spreads the rows through S, see PortableFlash).
__device__ __forceinline__ void LoadKvTile(const bf16_bits* kv, int my_slot, bf16_bits* dst,
                                           int warp, int lane) {
  constexpr int kRowsPerWarp = kCols / kWarps;
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
    LoadKvRow(kv, my_slot, dst, warp * kRowsPerWarp + rr, lane);
  CpAsyncCommit();
}

// The slot of column tile_col + lane, or of the last column (col_end - 1) past it. Every work item
// has at least one column (the split planner cuts at most one split per tile), so col_end - 1 is
// always one of the item's own columns.
__device__ __forceinline__ int TileSlot(const int32_t* slots, int tile_col, int col_end, int lane) {
  return slots[min(tile_col + lane, col_end - 1)];
}

// A lane's view of the pair's 16 rows: rows g (half 0) and g + 8 (half 1) of its row group.
struct RowState {
  float ref[2];  // the reference maximum exp2 is taken against (log2 units), -inf before any
  float sum[2];  // this lane's share of sum exp2(S - ref) (its 2 of every 8 columns)
  int node[2];   // tree node of the row, -1 past the sequence's rows
};

// Phase 1 (prologue): Q through the KV buffers into this warp's latent A fragments; the rope dims
// into their own shared rows.
__device__ __forceinline__ void StageQ(const VerifyProblem& pr, int64_t first_row, int rows_here,
                                       SharedPlan& sm, int tid, int lane, int rg, int kg,
                                       uint32_t (&q_frag)[kNopeKSteps][4]) {
  bf16_bits* stage = sm.kv[0];  // the two buffers are contiguous: 64 rows fit across them
  for (int chunk = tid; chunk < kRows * kChunksPerRow; chunk += kFlashThreads) {
    const int r = chunk / kChunksPerRow;
    const int cc = chunk % kChunksPerRow;
    const bool valid = r < rows_here;
    const bf16_bits* src = valid ? pr.q + (first_row + r) * kKvDim + cc * 8 : pr.q;
    bf16_bits* dst = cc * 8 < kVDim ? stage + r * kStride + cc * 8
                                    : sm.q_rope + r * kRopeStride + cc * 8 - kVDim;
    CpAsync16(SmemAddr(dst), src, valid);
  }
  CpAsyncCommit();
  CpAsyncWaitAll();
  __syncthreads();
#pragma unroll
  for (int ks = 0; ks < kNopeKSteps; ++ks) {
    const int k0 = (kg * kNopeKSteps + ks) * 16;
    LdMatrixX4(q_frag[ks],
               SmemAddr(stage + (rg * 16 + (lane & 15)) * kStride + k0 + (lane >> 4) * 8));
  }
  __syncthreads();  // the staging bytes become KV tile 0
}

// Phase 2: this warp's partial S, 16 rows x 32 columns over its 256 latent + 32 rope dims: 36
// steps (k-step, n-tile pair), each one ldmatrix.x4 of K and two mma, the K fragments loaded
// kDepth steps ahead. hook(step) runs after each step's mma (the loop's copies ride there).
template <int kDepth, typename StepHook>
__device__ __forceinline__ void SPartial(const bf16_bits* kv_tile, const SharedPlan& sm,
                                         const uint32_t (&q_frag)[kNopeKSteps][4], int lane, int rg,
                                         int kg, float (&s)[kNTiles][4], StepHook&& hook) {
  constexpr int kPairs = kNTiles / 2;
  constexpr int kSteps = (kNopeKSteps + kRopeKSteps) * kPairs;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[nt][i] = 0.f;
  auto k_of = [&](int ks) {
    return ks >= kNopeKSteps ? kVDim + (kg * kRopeKSteps + ks - kNopeKSteps) * 16
                             : (kg * kNopeKSteps + ks) * 16;
  };
  auto b_addr = [&](int step) {
    const int np = step % kPairs;
    return SmemAddr(kv_tile + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kStride +
                    k_of(step / kPairs) + ((lane >> 3) & 1) * 8);
  };
  uint32_t b[kDepth + 1][4];
#pragma unroll
  for (int d = 0; d < kDepth; ++d) LdMatrixX4(b[d], b_addr(d));
  uint32_t rope_frag[kRopeKSteps][4];
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    if (step + kDepth < kSteps)
      LdMatrixX4(b[(step + kDepth) % (kDepth + 1)], b_addr(step + kDepth));
    if (step == kNopeKSteps * kPairs - 2 * kPairs) {
#pragma unroll
      for (int r = 0; r < kRopeKSteps; ++r)
        LdMatrixX4(rope_frag[r], SmemAddr(sm.q_rope + (rg * 16 + (lane & 15)) * kRopeStride +
                                          k_of(kNopeKSteps + r) - kVDim + (lane >> 4) * 8));
    }
    const int ks = step / kPairs;
    const int np = step % kPairs;
    uint32_t a[4];  // ks is a constant after unrolling: this selects registers, it copies nothing
#pragma unroll
    for (int i = 0; i < 4; ++i)
      a[i] = ks >= kNopeKSteps ? rope_frag[ks >= kNopeKSteps ? ks - kNopeKSteps : 0][i]
                               : q_frag[ks < kNopeKSteps ? ks : 0][i];
    const uint32_t(&bb)[4] = b[step % (kDepth + 1)];
    MmaBf16(s[2 * np], a, bb[0], bb[1]);
    MmaBf16(s[2 * np + 1], a, bb[2], bb[3]);
    hook(step);
  }
}

// Phase 3: the pair swap. Each warp publishes its partial, waits for its partner's, and both form
// S = partial(kg 0) + partial(kg 1) in that order (the same bits in both warps), scaled to log2
// units and masked.
__device__ __forceinline__ void PairSwap(SharedPlan& sm, int warp, int lane, int rg, int kg,
                                         uint32_t parity, float scale_log2,
                                         float (&s)[kNTiles][4]) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
    sm.s_swap[warp][nt][lane] = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
  const uint32_t bar = SmemAddr(&sm.pair_barrier[rg]);
  MbarrierArrive(bar);
  MbarrierWait(bar, parity);
  const int partner = warp ^ 4;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const float4 o = sm.s_swap[partner][nt][lane];
    const float other[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      s[nt][i] = (kg == 0 ? s[nt][i] + other[i] : other[i] + s[nt][i]) * scale_log2;
  }
}

// Phase 4: mask, online softmax, P as A fragments. Value (nt, i) of this lane is row g + 8 (i / 2),
// column tile_col + 8 nt + 2c + (i % 2). Returns whether any lane's reference moved (then O must be
// rescaled by alpha).
__device__ __forceinline__ bool Softmax(float (&s)[kNTiles][4], RowState& st, int tile_col,
                                        int col_end, int prefix_len, const uint64_t* mask_rows,
                                        int words_per_row, int c, float (&alpha)[2],
                                        uint32_t (&pa)[kCols / 16][4]) {
  const bool all_visible = tile_col + kCols <= prefix_len && tile_col + kCols <= col_end;
  if (!all_visible) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = tile_col + nt * 8 + 2 * c + (i & 1);
        const int node = st.node[i >> 1];
        const bool visible =
            t < col_end && (t < prefix_len || (node >= 0 && ColumnVisible(mask_rows, words_per_row,
                                                                          prefix_len, node, t)));
        s[nt][i] = visible ? s[nt][i] : -INFINITY;
      }
  }
  float base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
      tile_max = fmaxf(tile_max, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
    // The reference moves only when a score passes it by 2^8 (P stays below 256 in bf16 and
    // fp32), so O is rescaled a few times per row rather than at most tiles.
    const float new_ref = tile_max > st.ref[h] + 8.f ? tile_max : st.ref[h];
    // A row that has seen nothing yet keeps -inf; subtracting 0 then keeps exp2 finite.
    base[h] = new_ref == -INFINITY ? 0.f : new_ref;
    alpha[h] = Exp2Ftz(st.ref[h] - base[h]);
    st.ref[h] = new_ref;
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[nt][i] = Exp2Ftz(s[nt][i] - base[i >> 1]);
      sum[i >> 1] += s[nt][i];
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) st.sum[h] = st.sum[h] * alpha[h] + sum[h];
#pragma unroll
  for (int kk = 0; kk < kCols / 16; ++kk) {
    pa[kk][0] = mma::PackBf16x2(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = mma::PackBf16x2(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = mma::PackBf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = mma::PackBf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
  return __any_sync(kFullMask, alpha[0] != 1.f || alpha[1] != 1.f);
}

// Phase 5: O = O * alpha + P V over this warp's 16 rows and 256 value columns. hook(step) runs
// after each of the 32 steps' mma (an fp8 pool's widening rides there).
template <typename StepHook>
__device__ __forceinline__ void AccumulatePv(const bf16_bits* kv_tile,
                                             const uint32_t (&pa)[kCols / 16][4], bool rescale,
                                             const float (&alpha)[2], int lane, int kg,
                                             float (&o)[kOTiles][4], StepHook&& hook) {
  if (rescale) {
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int kk = 0; kk < kCols / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kOTiles / 2; ++np) {
      const int n0 = kg * (kVDim / 2) + np * 16;
      uint32_t vb[4];
      LdMatrixX4Trans(
          vb, SmemAddr(kv_tile + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + n0 +
                       (lane >> 4) * 8));
      MmaBf16(o[2 * np], pa[kk], vb[0], vb[1]);
      MmaBf16(o[2 * np + 1], pa[kk], vb[2], vb[3]);
      hook(kk * (kOTiles / 2) + np);
    }
  }
}

// Phase 6 (epilogue): O / sum staged as bf16 rows in the idle KV buffers, then whole-row 16-byte
// stores; the LSE from k group 0's lanes.
__device__ __forceinline__ void Epilogue(const MlaVerifyParams& params, const FlashWorkItem& item,
                                         int64_t first_row, int rows_here, SharedPlan& sm,
                                         const RowState& st, const float (&o)[kOTiles][4], int tid,
                                         int lane, int rg, int kg) {
  const int g = lane >> 2;
  const int c = lane & 3;
  float total[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = st.sum[h];
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    total[h] = sum;
  }
  CpAsyncWaitAll();  // nothing is in flight after the last tile; this makes it certain
  __syncthreads();   // every warp is done reading the last tile
  uint8_t* stage = reinterpret_cast<uint8_t*>(sm.kv[0]);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = rg * 16 + g + 8 * h;
    const float inv = total[h] > 0.f ? 1.f / total[h] : 0.f;
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      const int col = kg * (kVDim / 2) + nt * 8 + 2 * c;
      *reinterpret_cast<uint32_t*>(stage + r * flash::kStageStride + col * 2) =
          mma::PackBf16x2(o[nt][2 * h] * inv, o[nt][2 * h + 1] * inv);
    }
  }
  __syncthreads();
  uint8_t* dst = flash::OutRows(params, item, first_row);
  constexpr int kUnitsPerRow = flash::kOutRowBytes / 16;
  for (int idx = tid; idx < rows_here * kUnitsPerRow; idx += kFlashThreads) {
    const int r = idx / kUnitsPerRow;
    const int u = idx % kUnitsPerRow;
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * flash::kOutRowBytes + u * 16) =
        *reinterpret_cast<const uint4*>(stage + r * flash::kStageStride + u * 16);
  }
  if (kg == 0 && c == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = rg * 16 + g + 8 * h;
      if (r < rows_here)
        flash::WriteLse(params, item, first_row, r, flash::RowLse(st.ref[h], total[h]));
    }
  }
}

// How the pool's rows are stored: bf16 (1152 bytes, copied as they are) or DeepSeek's fp8 layout
// (656 bytes, widened to bf16 by the load stage of mla_verify_kv_fp8_load.cuh).
enum class KvRows { kBf16, kFp8 };

// The kernel's body, for a `__global__` wrapper launched with kFlashThreads threads, one CTA per
// work item and kSmemBytes of dynamic shared memory (the product's are the MlaVerifyFlashKernel
// instances, mla_verify_flash.cu). kRowsKind picks the load stage; every other phase is the same.
template <KvRows kRowsKind>
__device__ __forceinline__ void PortableFlash(const MlaVerifyParams& params) {
  constexpr bool kFp8 = kRowsKind == KvRows::kFp8;
  pdl::AllowDependentLaunch();  // the combine may be scheduled early (programmatic_launch.cuh)
  extern __shared__ __align__(128) uint8_t smem[];
  SharedPlan& sm = *reinterpret_cast<SharedPlan*>(smem);
  const VerifyProblem& pr = params.problem;
  const FlashWorkItem item = params.work[blockIdx.x];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int c = lane & 3;
  const int rg = warp & 3;
  const int kg = warp >> 2;
  const flash::ItemRows rows = flash::DecodeItem(pr, item);

  if (tid < 4) MbarrierInit(SmemAddr(&sm.pair_barrier[tid]), 64);
  uint32_t q_frag[kNopeKSteps][4];
  StageQ(pr, rows.first_row, rows.rows_here, sm, tid, lane, rg, kg, q_frag);

  float o[kOTiles][4];
#pragma unroll
  for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[nt][i] = 0.f;
  RowState st;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = item.row_begin + rg * 16 + g + 8 * h;
    st.ref[h] = -INFINITY;
    st.sum[h] = 0.f;
    st.node[h] = row < rows.seq_rows ? row / rows.heads : -1;
  }
  const float scale_log2 = pr.scale * kLog2e;

  constexpr int kRowsPerWarp = kCols / kWarps;
  static_assert(!kFp8 || kRowsPerWarp == fp8::kRowsPerWarp, "the fp8 stage's row ownership");
  const int num_tiles = (item.col_end - item.col_begin + kCols - 1) / kCols;
  const int first_slot = TileSlot(rows.slots, item.col_begin, item.col_end, lane);
  if constexpr (kFp8) {
    uint8_t* buffer = reinterpret_cast<uint8_t*>(sm.kv[0]);
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr)
      fp8::LoadRawRow(pr.kv_fp8, first_slot, buffer, warp, rr, lane);
    CpAsyncCommit();
    CpAsyncWaitAll();
    __syncwarp();  // the warp's raw rows are in for every lane
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) fp8::WidenRow(buffer, warp, rr, lane);
  } else {
    LoadKvTile(pr.kv, first_slot, sm.kv[0], warp, lane);
  }
  int next_slot = TileSlot(rows.slots, item.col_begin + kCols, item.col_end, lane);
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int tile_col = item.col_begin + tile * kCols;
    CpAsyncWaitAll();
    __syncthreads();  // tile lands for everyone; everyone is done with the other buffer and swap
    const bool refill = tile + 1 < num_tiles;
    bf16_bits* next_buffer = sm.kv[(tile + 1) & 1];
    const bf16_bits* kv_tile = sm.kv[tile & 1];
    float s[kNTiles][4];
    SPartial<kKPrefetch>(kv_tile, sm, q_frag, lane, rg, kg, s, [&](int step) {
      if (!refill) return;
      if constexpr (kFp8) {
        // Raw rows at steps 1, 5, 9, 13, one group each: widened in P V(j), so they have S's
        // remaining steps, the swap and the softmax to land.
        if (step % 4 == 1 && step / 4 < kRowsPerWarp) {
          fp8::LoadRawRow(pr.kv_fp8, next_slot, reinterpret_cast<uint8_t*>(next_buffer), warp,
                          step / 4, lane);
          CpAsyncCommit();
        }
      } else {
        // Tile j+1's rows at steps 1, 9, 17, 25 of 36: between the mma, not all at once after the
        // barrier, where 8 warps' 12 copies each filled the load queue (lg_throttle, plans/0027).
        if (step % 8 == 1 && step / 8 < kRowsPerWarp) {
          LoadKvRow(pr.kv, next_slot, next_buffer, warp * kRowsPerWarp + step / 8, lane);
          if (step / 8 == kRowsPerWarp - 1) CpAsyncCommit();
        }
      }
    });
    if (refill) next_slot = TileSlot(rows.slots, tile_col + 2 * kCols, item.col_end, lane);
    PairSwap(sm, warp, lane, rg, kg, tile & 1, scale_log2, s);
    float alpha[2];
    uint32_t pa[kCols / 16][4];
    const bool rescale = Softmax(s, st, tile_col, item.col_end, rows.prefix_len, rows.mask_rows,
                                 rows.words_per_row, c, alpha, pa);
    AccumulatePv(kv_tile, pa, rescale, alpha, lane, kg, o, [&](int step) {
      if constexpr (kFp8) {
        // Raw row r of tile j+1 widened at step 4 + 8r of 32, once its group (the r-th of four)
        // is complete.
        if (refill && step % 8 == 4) {
          uint8_t* buffer = reinterpret_cast<uint8_t*>(next_buffer);
          switch (step / 8) {
            case 0:
              fp8::CpAsyncWaitGroup<3>();
              break;
            case 1:
              fp8::CpAsyncWaitGroup<2>();
              break;
            case 2:
              fp8::CpAsyncWaitGroup<1>();
              break;
            default:
              fp8::CpAsyncWaitGroup<0>();
              break;
          }
          __syncwarp();  // the row's chunks, copied by every lane, are in for every lane
          fp8::WidenRow(buffer, warp, step / 8, lane);
        }
      }
    });
  }
  Epilogue(params, item, rows.first_row, rows.rows_here, sm, st, o, tid, lane, rg, kg);
}

}  // namespace verifyd::portable
