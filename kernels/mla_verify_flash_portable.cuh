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
// Warps (8, 256 threads): warp w = (row group rg = w / 4: rows 32 rg .. 32 rg + 31, quarter
// qw = w % 4), so each scheduler (w % 4) holds one warp of each row group. Every warp works on 32
// rows (two m-tiles): each K or V fragment it loads from shared memory feeds four mma, not two —
// on the H200 a 16-row warp needs 2 shared-memory wavefronts per mma, more than the pipe's pace
// (plans/0029).
// - Registers: O (64 x 512 fp32) as 32 rows x 128 value columns per warp (128 registers); Q as mma
//   A fragments of the warp's quarter of k, 32 rows x (latent dims 128 qw .. 128 qw + 127 and rope
//   dims 512 + 16 qw .. + 15): 9 k-steps x 2 m-tiles (72 registers).
// - S: each warp computes a partial S (32 x 32 over its 144 of the 576 dims) in two halves of 16
//   columns (the half without its own n-tile first), four independent accumulators per step; the
//   four warps of a row group reduce-scatter their partials through shared memory: warp qw owns
//   S's n-tile qw (8 columns) and adds the three partials of it the others wrote.
// - Softmax on the owned 32 x 8: each owner publishes its rows' maxima and P (bf16, in A-fragment
//   order) against the current references; after a group barrier every warp reads the four maxima
//   of its rows, so all four keep the same reference per row. A reference moves only when a score
//   passes it by 2^8 (O is rescaled a few times per row, not at most tiles); on a tile where one
//   does, all four warps see it, the owner redoes P and the group meets once more.
// - P V: each warp reads all of P (32 x 32) for its rows and multiplies it by V's columns of its
//   quarter (32 x 128): V by ldmatrix.trans, each fragment feeding both m-tiles.
// - Registers: O (64 x 512 fp32) as 32 rows x 128 value columns per warp (128 registers); Q as mma
//   A fragments of the warp's quarter of k, 32 rows x (latent dims 128 qw .. 128 qw + 127 and rope
//   dims 512 + 16 qw .. + 15): 9 k-steps x 2 m-tiles (72 registers). That leaves the loop so few
//   that the references, the row sums, the item and the copies' slots live in shared memory.
//
// Schedule per tile j (each step a phase below):
//   1. wait for this thread's copies of tile j, CTA barrier: tile j is in for everyone, and every
//      warp has finished tile j-1, so the other buffer, the partials and P are free;
//   2. S partial (SPartial), K fragments two steps ahead of their mma; the copies of tile j+1 into
//      the other buffer ride between its mma, one row per warp every 4 of its 18 steps; each half's
//      partials leave for their owners as the half ends;
//   3. group barrier A; the owner reduces its n-tile (ReduceOwned), masks it, publishes its row
//      maxima and P (SoftmaxOwned); group barrier B; the references and the sums, on a tile where
//      a reference moved also O's rescale, P again and the redo barrier (SettleReference);
//   4. P V (AccumulatePv).
// The four warps of a row group meet at A and B; the two groups meet only at the CTA barrier. A
// barrier costs: one more group barrier on every tile (P written after the references settle)
// measured 9-12 % slower (plans/0029).
//
// Shared memory (101,072 B of the 101,376 B that sm_120 allows per block):
//   KV tiles  2 x 32 x 584 bf16, rows padded by 16 B so ldmatrix rows hit distinct banks; the
//             prologue stages the 64-row Q tile, the epilogue O, through the same bytes; the
//             padding of row r of buffer rg holds group rg's row sums (RowSums)       74752 B
//   partials  [rg][owner n-tile][3 writers][m-tile][32 lanes] float4, lane-contiguous;
//             an owner's P (bf16 A-fragment pairs) goes over the first partial slot of its
//             own n-tile once it has read it                                          24576 B
//   row maxima [rg][32 rows][4 quarters] fp32                                            1024 B
//   the work item and its sequence's view (ItemRows), the copies' next slots              192 B
//   the rows' reference maxima, by tile parity; the groups' redo mbarriers                528 B
//
// KV rows are gathered through the int32 slot table with 16-byte cp.async, warp w copying rows
// 4w .. 4w+3 of a tile; lane i holds the slot of column i. One-run and scattered tiles take the
// same path. A column past col_end copies the last column's row, which the mask turns into P = 0,
// so a masked column never multiplies garbage (0 * NaN) into O.
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
inline constexpr int kGroups = 2;                             // row groups of 32 rows
inline constexpr int kQuarters = kWarps / kGroups;            // warps per row group
inline constexpr int kGroupRows = kRows / kGroups;            // 32
inline constexpr int kStride = kKvDim + 8;                    // bf16 per padded shared row (1168 B)
inline constexpr int kChunksPerRow = kKvDim / 8;              // 16-byte chunks per KV row
inline constexpr int kLatentKSteps = kVDim / 16 / kQuarters;  // 8 latent k-steps per quarter
inline constexpr int kKSteps = kLatentKSteps + 1;             // + one rope k-step
inline constexpr int kONTiles = kVDim / kQuarters / 8;        // 16 O n-tiles per warp
inline constexpr int kKPrefetch = 2;  // S's K fragments in flight ahead of their mma
inline constexpr unsigned kGroupThreads = kQuarters * 32;
inline constexpr int kRowsPerWarp = kCols / kWarps;  // warp w copies rows 4w .. 4w + 3 of a tile

static_assert(kQuarters * 16 == kRopeDim, "each quarter takes one rope k-step");
static_assert(kCols / 8 == kQuarters, "each quarter owns one S n-tile");

// The shared-memory plan; its size is the kernel's dynamic shared memory.
struct SharedPlan {
  bf16_bits kv[2][kCols * kStride];
  float4 partial[kGroups][kQuarters][kQuarters - 1][2][32];
  float row_max[kGroups][kGroupRows][kQuarters];
  // The work item and its sequence's view, read back from here inside the loop: held in registers
  // they would push the tile loop past 255.
  FlashWorkItem item;
  flash::ItemRows rows;
  // Each warp's slots of its rows of the tile after the next: looked up during P V, read by the
  // next S's copies (a register from lookup to use would spill the loop).
  int32_t next_slots[kWarps][kRowsPerWarp];
  // Each row's reference maximum (log2 units, -inf before any column), by tile parity: read by
  // every warp of the group, the next tile's written by quarter 0 (kept here, not in registers,
  // for the same reason).
  float ref[2][kGroups][kGroupRows];
  uint64_t redo_barrier[kGroups];  // each group's meeting after a redone P (SettleReference)
  uint32_t redo_phase[kGroups];    // the parity the next redo meeting waits for
};
inline constexpr int kSmemBytes = sizeof(SharedPlan);
static_assert(kSmemBytes <= 101376, "sm_120 allows 101,376 bytes of shared memory per block");
static_assert(kRows * kStride * sizeof(bf16_bits) <= sizeof(SharedPlan::kv),
              "the Q staging tile must fit in the KV buffers");
static_assert(kRows * flash::kStageStride <= sizeof(SharedPlan::kv),
              "the staged O fits the KV buffers");
static_assert(kCols % kWarps == 0, "each warp copies whole rows of a tile");

// The four warps of row group rg meet (named barriers 1 and 2; 0 is __syncthreads).
__device__ __forceinline__ void GroupBarrier(int rg) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(rg + 1), "r"(kGroupThreads) : "memory");
}

// A group's meeting on an mbarrier of count kGroupThreads (sm_80 forms: arrive, then test_wait on
// the phase the arrive returned). It serves the meeting only some tiles have (SettleReference's
// redo): a named barrier used on some tiles only leaves compute-sanitizer's racecheck pairing the
// groups' barriers wrongly (49,664 false hazards, plans/0029).
__device__ __forceinline__ void MbarrierInit(uint32_t addr, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
// Every thread reads the phase before it arrives (the phase cannot complete before that), and
// quarter 0's first lane flips it once the meeting is over, long before the next one (barriers A
// and B of a later tile come between).
__device__ __forceinline__ void MbarrierMeet(uint32_t addr, uint32_t* phase, bool flips) {
  const uint32_t parity = *phase;
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared.b64 state, [%0];\n}\n" ::"r"(addr)
               : "memory");
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
  if (flips) *phase = parity ^ 1;
}

// Issues the cp.async copies of KV row r (column tile_col + r) of a tile, whose slot is `slot`,
// into `dst`: lane i copies 16-byte chunks i, i + 32, i + 64 (< 72). A column past col_end copies
// the last column's row (TileSlot), real finite KV that the mask turns into P = 0: no copy needs
// zero-fill, and a row's three chunks are one pointer plus constant offsets (the first loader's
// per-chunk selects and zero-fill sizes were ~190 instructions a tile per warp, plans/0027).
__device__ __forceinline__ void LoadKvRow(const bf16_bits* kv, int slot, bf16_bits* dst, int r,
                                          int lane) {
  const bf16_bits* src = kv + static_cast<int64_t>(slot) * kKvDim + lane * 8;
  const uint32_t to = SmemAddr(dst + r * kStride + lane * 8);
  mma::CpAsync16Full(to, src);
  mma::CpAsync16Full(to + 512, src + 256);
  if (lane < kChunksPerRow - 64) mma::CpAsync16Full(to + 1024, src + 512);
}

// The slot of column col, or of the last column (col_end - 1) past it. Every work item has at
// least one column (the split planner cuts at most one split per tile), so col_end - 1 is always
// one of the item's own columns.
__device__ __forceinline__ int ColumnSlot(const int32_t* slots, int col, int col_end) {
  return slots[min(col, col_end - 1)];
}

// The first tile's rows at once (the loop spreads its rows through S, see PortableFlash); lane i
// looks up column tile_col + i.
__device__ __forceinline__ void LoadKvTile(const bf16_bits* kv, const int32_t* slots, int tile_col,
                                           int col_end, bf16_bits* dst, int warp, int lane) {
  const int my_slot = ColumnSlot(slots, tile_col + lane, col_end);
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    LoadKvRow(kv, __shfl_sync(kFullMask, my_slot, r), dst, r, lane);
  }
  CpAsyncCommit();
}

// Row r of group rg's sums of exp2(S - ref), one float per quarter (its owned columns): in the
// 16 padding bytes that end row r of KV buffer rg, which no copy and no ldmatrix touches (held in
// registers they would push the tile loop past 255).
__device__ __forceinline__ float* RowSums(SharedPlan& sm, int rg, int r) {
  return reinterpret_cast<float*>(sm.kv[rg] + r * kStride + kKvDim);
}

// Where writer qw puts its partial of n-tile n (n != qw) for m-tile m.
__device__ __forceinline__ float4* PartialSlot(SharedPlan& sm, int rg, int n, int qw, int m) {
  return sm.partial[rg][n][(qw - n + kQuarters) % kQuarters - 1][m];
}

// The owner of n-tile n keeps P of m-tile m (32 lanes x 2 packed bf16 pairs) over the first partial
// slot of its n-tile, which only it reads, once it has read it.
__device__ __forceinline__ uint2* POwned(SharedPlan& sm, int rg, int n, int m) {
  return reinterpret_cast<uint2*>(sm.partial[rg][n][0][m]);
}

// Phase 1 (prologue): Q through the KV buffers into this warp's A fragments (32 rows x its 144
// dims of k).
__device__ __forceinline__ void StageQ(const VerifyProblem& pr, int64_t first_row, int rows_here,
                                       SharedPlan& sm, int tid, int lane, int rg, int qw,
                                       uint32_t (&q_frag)[kKSteps][2][4]) {
  bf16_bits* stage = sm.kv[0];  // the two buffers are contiguous: 64 rows fit across them
  for (int chunk = tid; chunk < kRows * kChunksPerRow; chunk += kFlashThreads) {
    const int r = chunk / kChunksPerRow;
    const int cc = chunk % kChunksPerRow;
    const bool valid = r < rows_here;
    const bf16_bits* src = valid ? pr.q + (first_row + r) * kKvDim + cc * 8 : pr.q;
    CpAsync16(SmemAddr(stage + r * kStride + cc * 8), src, valid);
  }
  CpAsyncCommit();
  CpAsyncWaitAll();
  __syncthreads();
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    const int k0 = ks < kLatentKSteps ? (qw * kLatentKSteps + ks) * 16 : kVDim + qw * 16;
#pragma unroll
    for (int m = 0; m < 2; ++m)
      LdMatrixX4(q_frag[ks][m],
                 SmemAddr(stage + (rg * kGroupRows + m * 16 + (lane & 15)) * kStride + k0 +
                          (lane >> 4) * 8));
  }
  __syncthreads();  // the staging bytes become KV tile 0
}

// Phase 2: this warp's partial S, 32 rows x 32 columns over its 144 dims, as two halves of 16
// columns (the half without its own n-tile first): 18 steps (half, k-step), each one ldmatrix.x4
// of K feeding four mma (two m-tiles x two n-tiles: four independent accumulators, so the mma of a
// step do not wait on each other), K fragments kDepth steps ahead. Each finished n-tile but the
// owned one goes to its owner's slot; the owned one ends in `owned`. hook(step) runs after each
// step's mma (the loop's copies ride there).
template <int kDepth, typename StepHook>
__device__ __forceinline__ void SPartial(const bf16_bits* kv_tile, SharedPlan& sm,
                                         const uint32_t (&q_frag)[kKSteps][2][4], int lane, int rg,
                                         int qw, float (&owned)[2][4], StepHook&& hook) {
  constexpr int kSteps = 2 * kKSteps;
  const int own_half = qw >> 1;
  auto half_of = [&](int hh) { return hh == 0 ? own_half ^ 1 : own_half; };
  auto b_addr = [&](int step) {
    const int ks = step % kKSteps;
    const int k0 = ks < kLatentKSteps ? (qw * kLatentKSteps + ks) * 16 : kVDim + qw * 16;
    return SmemAddr(kv_tile +
                    (half_of(step / kKSteps) * 16 + (lane & 7) + (lane >> 4) * 8) * kStride + k0 +
                    ((lane >> 3) & 1) * 8);
  };
  uint32_t b[kDepth + 1][4];
#pragma unroll
  for (int d = 0; d < kDepth; ++d) LdMatrixX4(b[d], b_addr(d));
  float s[2][2][4];  // [m-tile][n-tile of the half][accumulator]
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int ks = step % kKSteps;
    if (ks == 0) {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[m][n][i] = 0.f;
    }
    if (step + kDepth < kSteps)
      LdMatrixX4(b[(step + kDepth) % (kDepth + 1)], b_addr(step + kDepth));
    const uint32_t(&bb)[4] = b[step % (kDepth + 1)];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      MmaBf16(s[m][0], q_frag[ks][m], bb[0], bb[1]);
      MmaBf16(s[m][1], q_frag[ks][m], bb[2], bb[3]);
    }
    hook(step);
    if (ks == kKSteps - 1) {
      const int half = half_of(step / kKSteps);
      const bool mine_second = (qw & 1) != 0;  // the owned n-tile within the own half
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        if (step / kKSteps == 1 && (n == 1) == mine_second) continue;
#pragma unroll
        for (int m = 0; m < 2; ++m)
          PartialSlot(sm, rg, half * 2 + n, qw, m)[lane] =
              make_float4(s[m][n][0], s[m][n][1], s[m][n][2], s[m][n][3]);
      }
    }
  }
  const bool mine_second = (qw & 1) != 0;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) owned[m][i] = mine_second ? s[m][1][i] : s[m][0][i];
}

// Phase 3a (after group barrier A): the owner adds the three partials of its n-tile the other
// warps wrote (in writer order, so the sum does not depend on timing), scales to log2 units and
// masks. Value (m, i) of this lane is row 16 m + g + 8 (i / 2), column tile_col + 8 qw + 2c + i
// % 2.
__device__ __forceinline__ void ReduceOwned(SharedPlan& sm, int rg, int qw, int lane,
                                            const VerifyProblem& pr, const flash::ItemRows& rows,
                                            const FlashWorkItem& item, int tile_col, int g, int c,
                                            float (&s)[2][4]) {
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int j = 0; j < kQuarters - 1; ++j) {
      const float4 o = sm.partial[rg][qw][j][m][lane];
      s[m][0] += o.x;
      s[m][1] += o.y;
      s[m][2] += o.z;
      s[m][3] += o.w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) s[m][i] *= pr.scale * kLog2e;
  }
  const int col_end = item.col_end;
  const int prefix_len = rows.prefix_len;
  const bool all_visible = tile_col + kCols <= prefix_len && tile_col + kCols <= col_end;
  if (all_visible) return;
    // The rows' tree nodes are worked out here rather than kept: only the tiles that reach the tree
    // or col_end need them, and the loop has no register to spare.
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int t = tile_col + qw * 8 + 2 * c + (i & 1);
      const int row = item.row_begin + rg * kGroupRows + m * 16 + g + 8 * (i >> 1);
      const int node = row < rows.seq_rows ? row / rows.heads : -1;
      const bool visible =
          t < col_end &&
          (t < prefix_len ||
           (node >= 0 && ColumnVisible(rows.mask_rows, rows.words_per_row, prefix_len, node, t)));
      s[m][i] = visible ? s[m][i] : -INFINITY;
    }
}

// A row's base for exp2: its reference, or 0 while it has seen nothing (keeps exp2 finite).
__device__ __forceinline__ float BaseOf(float ref) { return ref == -INFINITY ? 0.f : ref; }

// P of the owned n-tile against base (per row), packed into A-fragment pairs for every warp of the
// group.
__device__ __forceinline__ void WriteP(SharedPlan& sm, int rg, int qw, int lane,
                                       const float (&s)[2][4], const float (&base)[2][2]) {
  __syncwarp();  // the owner's lanes have read the slot P goes over (ReduceOwned)
#pragma unroll
  for (int m = 0; m < 2; ++m)
    POwned(sm, rg, qw, m)[lane] =
        make_uint2(mma::PackBf16x2(Exp2Ftz(s[m][0] - base[m][0]), Exp2Ftz(s[m][1] - base[m][0])),
                   mma::PackBf16x2(Exp2Ftz(s[m][2] - base[m][1]), Exp2Ftz(s[m][3] - base[m][1])));
}

// Phase 3b: the owned n-tile's row maxima to the group, and P against the current references
// (what it will be unless some row's maximum passed its reference: SettleReference).
__device__ __forceinline__ void SoftmaxOwned(SharedPlan& sm, int rg, int qw, int lane, int g, int c,
                                             const float (&s)[2][4], const float* ref) {
  float base[2][2];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(s[m][2 * h], s[m][2 * h + 1]);
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
      if (c == 0) sm.row_max[rg][m * 16 + g + 8 * h][qw] = mx;
      base[m][h] = BaseOf(ref[m * 16 + g + 8 * h]);
    }
  WriteP(sm, rg, qw, lane, s, base);
}

// Phase 3c (after group barrier B): every warp reads the four quarters' maxima of its rows. A row
// whose maximum passed its reference by 2^8 takes that maximum as its new reference (P then stays
// below 256); if any row of the group did (all four warps read the same maxima and keep the same
// references, so all four see it), O is rescaled, the owner redoes P and the group meets on its
// redo barrier. The owner adds its share to the row sums.
__device__ __forceinline__ void SettleReference(SharedPlan& sm, int rg, int qw, int lane, int g,
                                                const float (&s)[2][4], const float* ref,
                                                float* next_ref, float (&o)[2][kONTiles][4]) {
  float base[2][2];
  float alpha[2][2];
  bool moved = false;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m * 16 + g + 8 * h;
      const float4 q4 = *reinterpret_cast<const float4*>(sm.row_max[rg][row]);
      const float tile_max = fmaxf(fmaxf(q4.x, q4.y), fmaxf(q4.z, q4.w));
      const float old_ref = ref[row];
      const bool passes = tile_max > old_ref + 8.f;
      const float new_ref = passes ? tile_max : old_ref;
      if (qw == 0 && (lane & 3) == 0) next_ref[row] = new_ref;
      moved |= passes;
      base[m][h] = BaseOf(new_ref);
      alpha[m][h] = Exp2Ftz(old_ref - base[m][h]);
    }
  const bool redo = __any_sync(kFullMask, moved);
  if (redo) {
    WriteP(sm, rg, qw, lane, s, base);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int nt = 0; nt < kONTiles; ++nt) {
        o[m][nt][0] *= alpha[m][0];
        o[m][nt][1] *= alpha[m][0];
        o[m][nt][2] *= alpha[m][1];
        o[m][nt][3] *= alpha[m][1];
      }
  }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = Exp2Ftz(s[m][2 * h] - base[m][h]) + Exp2Ftz(s[m][2 * h + 1] - base[m][h]);
      sum += __shfl_xor_sync(kFullMask, sum, 1);
      sum += __shfl_xor_sync(kFullMask, sum, 2);
      if ((lane & 3) == 0) {
        float* row_sum = RowSums(sm, rg, m * 16 + g + 8 * h) + qw;
        *row_sum = redo ? *row_sum * alpha[m][h] + sum : *row_sum + sum;
      }
    }
  if (redo)  // B': the redone P is in
    MbarrierMeet(SmemAddr(&sm.redo_barrier[rg]), &sm.redo_phase[rg], qw == 0 && lane == 0);
}

// Phase 4: O += P V over this warp's 32 rows and 128 value columns.
__device__ __forceinline__ void AccumulatePv(SharedPlan& sm, const bf16_bits* kv_tile, int rg,
                                             int lane, int qw, float (&o)[2][kONTiles][4]) {
#pragma unroll
  for (int kk = 0; kk < kCols / 16; ++kk) {
    uint32_t pa[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const uint2 lo = POwned(sm, rg, 2 * kk, m)[lane];
      const uint2 hi = POwned(sm, rg, 2 * kk + 1, m)[lane];
      pa[m][0] = lo.x;
      pa[m][1] = lo.y;
      pa[m][2] = hi.x;
      pa[m][3] = hi.y;
    }
#pragma unroll
    for (int np = 0; np < kONTiles / 2; ++np) {
      const int n0 = qw * (kVDim / kQuarters) + np * 16;
      uint32_t vb[4];
      LdMatrixX4Trans(
          vb, SmemAddr(kv_tile + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + n0 +
                       (lane >> 4) * 8));
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        MmaBf16(o[m][2 * np], pa[m], vb[0], vb[1]);
        MmaBf16(o[m][2 * np + 1], pa[m], vb[2], vb[3]);
      }
    }
  }
}

// Phase 5 (epilogue): the row sums over the four quarters (through the row-maxima bytes), O / sum
// staged as bf16 rows in the idle KV buffers, then whole-row 16-byte stores; the LSE from
// quarter 0's lanes.
__device__ __forceinline__ void Epilogue(const MlaVerifyParams& params, const FlashWorkItem& item,
                                         int64_t first_row, int rows_here, SharedPlan& sm,
                                         const float* ref, const float (&o)[2][kONTiles][4],
                                         int tid, int lane, int rg, int qw) {
  const int g = lane >> 2;
  const int c = lane & 3;
  CpAsyncWaitAll();  // nothing is in flight after the last tile; this makes it certain
  __syncthreads();   // every warp is done with the last tile, and every quarter's sums are in
  float total[2][2];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 q4 = *reinterpret_cast<const float4*>(RowSums(sm, rg, m * 16 + g + 8 * h));
      total[m][h] = (q4.x + q4.y) + (q4.z + q4.w);
    }
  __syncthreads();  // the staged O goes over the sums; no warp uses a redo barrier any more
  uint8_t* stage = reinterpret_cast<uint8_t*>(sm.kv[0]);
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = rg * kGroupRows + m * 16 + g + 8 * h;
      const float inv = total[m][h] > 0.f ? 1.f / total[m][h] : 0.f;
#pragma unroll
      for (int nt = 0; nt < kONTiles; ++nt) {
        const int col = qw * (kVDim / kQuarters) + nt * 8 + 2 * c;
        *reinterpret_cast<uint32_t*>(stage + r * flash::kStageStride + col * 2) =
            mma::PackBf16x2(o[m][nt][2 * h] * inv, o[m][nt][2 * h + 1] * inv);
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
  if (qw == 0 && c == 0) {
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rg * kGroupRows + m * 16 + g + 8 * h;
        if (r < rows_here)
          flash::WriteLse(params, item, first_row, r,
                          flash::RowLse(ref[m * 16 + g + 8 * h], total[m][h]));
      }
  }
}

// The kernel's body, for a `__global__` wrapper launched with kFlashThreads threads, one CTA per
// work item and kSmemBytes of dynamic shared memory (the product's is MlaVerifyFlashKernel,
// mla_verify_flash.cu).
__device__ __forceinline__ void PortableFlash(const MlaVerifyParams& params) {
  pdl::AllowDependentLaunch();  // the combine may be scheduled early (programmatic_launch.cuh)
  extern __shared__ __align__(128) uint8_t smem[];
  SharedPlan& sm = *reinterpret_cast<SharedPlan*>(smem);
  const VerifyProblem& pr = params.problem;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int c = lane & 3;
  const int rg = warp / kQuarters;
  const int qw = warp % kQuarters;
  if (tid == 0) {
    sm.item = params.work[blockIdx.x];
    sm.rows = flash::DecodeItem(pr, sm.item);
  }
  if (tid < kGroups * kGroupRows) {
    sm.ref[0][tid / kGroupRows][tid % kGroupRows] = -INFINITY;
    *reinterpret_cast<float4*>(RowSums(sm, tid / kGroupRows, tid % kGroupRows)) =
        make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (tid < kGroups) {
    MbarrierInit(SmemAddr(&sm.redo_barrier[tid]), kGroupThreads);
    sm.redo_phase[tid] = 0;
  }
  __syncthreads();
  const FlashWorkItem& item = sm.item;
  const flash::ItemRows& rows = sm.rows;

  uint32_t q_frag[kKSteps][2][4];
  StageQ(pr, rows.first_row, rows.rows_here, sm, tid, lane, rg, qw, q_frag);

  float o[2][kONTiles][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int nt = 0; nt < kONTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[m][nt][i] = 0.f;

  LoadKvTile(pr.kv, rows.slots, item.col_begin, item.col_end, sm.kv[0], warp, lane);
  if (lane < kRowsPerWarp)
    sm.next_slots[warp][lane] =
        ColumnSlot(rows.slots, item.col_begin + kCols + warp * kRowsPerWarp + lane, item.col_end);
  int buffer = 0;
  for (int tile_col = item.col_begin; tile_col < item.col_end; tile_col += kCols, buffer ^= 1) {
    CpAsyncWaitAll();
    __syncthreads();  // tile lands for everyone; everyone is done with the other buffer and P
    const bool refill = tile_col + kCols < item.col_end;
    bf16_bits* next_buffer = sm.kv[buffer ^ 1];
    const bf16_bits* kv_tile = sm.kv[buffer];
    float s[2][4];
    SPartial<kKPrefetch>(kv_tile, sm, q_frag, lane, rg, qw, s, [&](int step) {
      // Tile j+1's rows at steps 1, 5, 9, 13 of 18: between the mma, not all at once after the
      // barrier, where 8 warps' 12 copies each fill the load queue (plans/0027).
      if (step % 4 == 1 && step / 4 < kRowsPerWarp && refill) {
        const int r = step / 4;
        LoadKvRow(pr.kv, sm.next_slots[warp][r], next_buffer, warp * kRowsPerWarp + r, lane);
        if (r == kRowsPerWarp - 1) CpAsyncCommit();
      }
    });
    GroupBarrier(rg);  // A: the partials are in
    ReduceOwned(sm, rg, qw, lane, pr, rows, item, tile_col, g, c, s);
    SoftmaxOwned(sm, rg, qw, lane, g, c, s, sm.ref[buffer][rg]);
    GroupBarrier(rg);  // B: the row maxima and P are in
    SettleReference(sm, rg, qw, lane, g, s, sm.ref[buffer][rg], sm.ref[buffer ^ 1][rg], o);
    // The slots of the tile after the next: looked up now, kept after P V (the lookup's latency
    // hides under it).
    const int after_next = ColumnSlot(
        rows.slots, tile_col + 2 * kCols + warp * kRowsPerWarp + lane % kRowsPerWarp, item.col_end);
    AccumulatePv(sm, kv_tile, rg, lane, qw, o);
    __syncwarp();  // every lane's copies of this tile read next_slots (they ran in S)
    if (lane < kRowsPerWarp) sm.next_slots[warp][lane] = after_next;
  }
  Epilogue(params, item, rows.first_row, rows.rows_here, sm, sm.ref[buffer][rg], o, tid, lane, rg,
           qw);
}

}  // namespace verifyd::portable
