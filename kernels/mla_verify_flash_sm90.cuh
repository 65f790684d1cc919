// The flash MLA tree-verify kernel, Hopper path (sm_90a only: wgmma). Same work items, mask
// semantics, outputs and split partials as the portable kernel (mla_verify_flash.cu); the
// launcher picks this one on a compute-capability-9 device when this sm_90a image is present.
// The kernel is a template over Sm90Probe so that the benchmark can build its instruments from
// this same source: mla_verify_flash_sm90.cu instantiates Sm90Probe::kNone alone (the product);
// tools/bench/mla_verify_flash_sm90_probes.cu the others (never linked into the product).
//
// Math (SPEC §1): rows r = node * H + head of one sequence, columns t = 0 .. L+Q-1 (prefix, then
// tree nodes); S = scale * Q K^T, -inf where node(r) cannot see t; O = softmax(S) V, LSE = ln sum
// exp(S). Online softmax in fp32 in log2 units, 32 KV columns (half a tile) per step.
//
// Tiling. One CTA = one work item = 64 rows x a column range, taken in halves of 32 columns. Two
// warpgroups (256 threads); warpgroup w owns the halves h = w, w + 2, w + 4, ... and the two run
// half a step apart, so that one's softmax runs while the other's S is on the tensor cores (v49,
// plans/0004; until v48 both worked on the same 64 columns in lock step and the tensor cores
// idled through every softmax and barrier).
// - S of a half (64 x 32, k = 576), by its owner: 36 wgmma m64n32k16, B = K from the half's ring
//   slot, A = Q from shared memory except for the first kQRegSteps k-steps, whose A fragments each
//   warp holds in registers for the whole item (80 registers: the kernel uses 255, no spills).
// - Softmax: each warpgroup has its own reference maximum per row, which moves lazily: only when a
//   score passes it by more than kMaxSlackLog2 (so P <= 2^8). A P goes to shared memory with the
//   reference it was made on, which is never below the reader's (run_halves says why): where a
//   row's two differ (rare: after the writer moved), the reader adopts the writer's, rescaling its
//   own O and sums in registers, so P is used as it is and no barrier is needed. Each keeps the row
//   sum of its own halves; the two sums and references meet once, after the last half.
// - O (64 x 512 fp32, 128 KB) is split by d_v: warpgroup w owns O[:, 256w .. 256w+256) for all 64
//   rows, 128 accumulator registers per thread. For its half h it adds P(h) V(h) (P from registers,
//   2 wgmma m64n256k16) and the other's P(h-1) V(h-1) (P from shared memory), B = V read MN-major
//   (transposed) from the same ring slot that served as K. Why split d_v rather than two passes
//   over the KV: a second pass would read every KV tile twice from device memory and recompute S;
//   splitting d_v costs only the P exchange (4 KB per half).
//
// Shared memory (wgmma_sm90.cuh: rows of 128 bytes, 128-byte swizzle, 1024-byte aligned):
//   Q       9 chunks of 64 rows (576 dims); chunks 0-4 are read into registers in the prologue and
//           their 40 KB then hold ring slot 4                                 73728 B
//   ring slots 0-3: a half each, 9 chunks of 32 rows (32 tokens x 576 dims) 147456 B
//   P       1 chunk (64 rows x 64 tokens: warpgroup w's half in tokens 32w..)   8192 B
//   published reference of each row per warpgroup 2 x 64 fp32, row sums 2 x 64, final references
//   2 x 64                                                                     1536 B
//   one mbarrier per ring slot for its data, one for "its owner is done with it", per
//   warpgroup one for "P published", one for "P read", and one for Q's copy       120 B
//   total 231032 B (+1024 for aligning the base) of the 232448 B an H200 block may take.
//
// Pipeline of a warpgroup, per own half h: wait for the half's slot (its mbarrier); issue S(h);
// wait for the other's P(h-1) (an mbarrier per warpgroup's P, whose arrive and wait are a release
// and an acquire by definition) and issue P(h-1) V(h-1); wait for S; mask (a separate
// loop for the halves that reach the tree or col_end); move the reference where a score passed it
// (rare: with O's rescale); issue P(h) V(h) (P from registers); wait until the other has read
// P(h-2), then publish P(h) and its reference; wait for P(h-1) V(h-1) and release P(h-1) to the
// other; refill the ring: half h+4 into the slot of half h-1 (after the other's "done" on it),
// while P(h) V(h) runs; wait for it, "done" on the slot of h. Half h+4 thus has about one round of
// both warpgroups to land. (v56: the own P V issued before P goes out and the refill under it,
// 1.5-3 % on the long shapes; the own P V first alone, v54, was slower, and the refill before the
// P V wait alone, v49i, level.) KV rows come through the int32 slot table (page size 1); columns
// past col_end are zero-filled so a masked column never multiplies garbage. How a half arrives:
// - one run of 32 consecutive slots before col_end (compaction leaves most sequences so): one bulk
//   tensor copy (TMA, box 64 dims x 32 slots x 9 chunks, kv_tile_map.h) issued by the owner's
//   first thread. Nine 2-D copies per half cost that thread ~750 clocks (~250 each) on its
//   warpgroup's path (v49f), the single 3-D copy ~250 (v49h);
// - otherwise (a fragmented pool, the tree's columns, the range's end): gathered at the refill by
//   the owner's 128 threads, 16-byte cp.async, completing on the slot's mbarrier through
//   cp.async.mbarrier.arrive.noinc (~1.6 kclk of the warpgroup's path; woven between the wgmma of
//   its next S instead, as the lock-step kernel did, it was slower on every shape, v49j).
// A slot's mbarrier expects its owner's 128 threads either way (for a copy, the first thread's
// arrival also announces the bytes), so the warpgroups pass no barrier but __syncthreads and
// mbarriers (v50: the warpgroup-local named barriers of v49 left racecheck unable to pair the
// epilogue's stores and loads across its __syncthreads: thousands of false hazards).
// Prologue: Q (the item's 64 rows) comes by one bulk tensor copy (kv_tile_map.h: box 64 dims x 64
// rows x 9 chunks; 16-byte gathers where the batch has fewer than 64 rows and the driver makes no
// map), and halves 0 and 1 by one copy each as above (else gathered); halves 2 and 3 are copied
// once Q has landed (issued with Q and tile 0, they slowed the landing every CTA waits for:
// v49h/v49k). The first four halves' slot words are read in one round trip before any of it (v52:
// read one half at a time, each load waited behind the previous half's copy issue and arrivals,
// ~2 us in all); every CTA then waits mostly for the all-CTA burst of Q and tile 0.
//
// Epilogue: O / rowsum over both warpgroups' sums at the larger of their references, as bf16 (the
// output, or a split's partial), goes to shared memory (ring slots 0-1 are free by then: 64 rows
// padded to 1056 B) and leaves as one bulk copy (cp.async.bulk) per row. Measured on the H200 (v10,
// fp32 partials then): the direct 8-byte stores from the accumulators took ~14 us per CTA when all
// CTAs end together (132 x 128 KB of partials), 16-byte coalesced stores from the stage ~5.5 us,
// the bulk copies ~5 us; the other two were deleted.
//
// Launch: as usual; its first statement lets the combine, launched programmatically behind it
// (programmatic_launch.cuh), be scheduled, so the combine's CTAs start on each SM this grid leaves
// (v30, plans/0004: -1.5 us per call at S1).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/kv_tile_map.h"
#include "kernels/mla_verify_flash_common.cuh"
#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_mma.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/tma_sm90.cuh"
#include "kernels/tree_visibility.cuh"
#include "kernels/wgmma_sm90.cuh"
#include "verify/mla_dims.h"

namespace verifyd::flash_sm90 {

using flash::Exp2Ftz;
using flash::kFullMask;
using flash::kLog2e;
using flash::kRows;
using mma::CpAsync16;
using mma::CpAsyncCommit;
using mma::CpAsyncWaitAll;
using wgmma::kChunkBytes;
using wgmma::SwizzledOffset;

// S's first kQRegSteps k-steps (16 dims each) take A = Q from registers, loaded once: each is a
// 2 KB shared-memory read per warpgroup per tile that S no longer makes (S at N = 32 is bound by
// its operand reads: wgmma_rate_bench on the H200, m64n32k16 with both operands in shared memory
// 24 clocks per SM, with A from registers 17.3, against 16 at the tensor peak). Measured (v20,
// plans/0004): 8, 12, 16, 20 steps ran faster in that order;
// 20 brings the kernel to 255 registers with no spills, 24 makes ptxas serialise the wgmma (C7512).
constexpr int kQRegSteps = 20;
static_assert(kQRegSteps > 0 && kQRegSteps <= kKvDim / 16, "a k-step count of S");
// How far (log2 units) a score may pass its row's reference maximum before the reference moves: P
// stays <= 2^8, exact enough in bf16 and far from overflow in the fp32 sums.
constexpr float kMaxSlackLog2 = 8.f;
constexpr int kUnitsPerRow = kKvDim / 8;  // 16-byte units per KV row (72)
constexpr int kKvChunks = kKvDim / 64;    // 9
constexpr int kTileBytes = kKvChunks * kChunkBytes;
constexpr int kQOffset = 0;
constexpr int kKvOffset = kQOffset + kTileBytes;
constexpr int kPOffset = kKvOffset + 2 * kTileBytes;
constexpr int kPublishedRefOffset = kPOffset + kChunkBytes;
constexpr int kSumXchgOffset = kPublishedRefOffset + 2 * kRows * 4;
// The ring (see run_halves): 32-column halves of a tile, each 9 chunks of 32 rows,
// five of them: the two stages as four, and Q's first five chunks (40 KB, read into registers
// in the prologue) as the fifth.
constexpr int kHalfCols = 32;
constexpr int kHalfChunkBytes = kHalfCols * wgmma::kSwizzleRowBytes;
constexpr int kHalfBytes = kKvChunks * kHalfChunkBytes;
constexpr int kRingHalves = 5;
static_assert(4 * kHalfBytes == 2 * kTileBytes, "the two stages are four halves");
static_assert(kHalfBytes <= (kQRegSteps / 4) * kChunkBytes,
              "the fifth half fits in the chunks of Q that live in registers");
constexpr int kFinalRefOffset = kSumXchgOffset + 2 * kRows * 4;
constexpr int kRingBarOffset = kFinalRefOffset + 2 * kRows * 4;  // full, then done, per half slot
// P(w) published / read, per warpgroup: mbarriers of 128 arrivals (every thread of the warpgroup
// that wrote or read it).
constexpr int kPBarOffset = kRingBarOffset + 2 * kRingHalves * 8;
constexpr int kSmemUsed = kPBarOffset + 5 * 8;  // + Q's
constexpr int kSmemBytes = kSmemUsed + 1024;    // room to align the base to 1024
static_assert(kSmemBytes <= 232448, "an sm_90 block may take 227 KB of dynamic shared memory");
static_assert(kRows * flash::kStageStride <= 2 * kTileBytes,
              "the staged epilogue fits the KV stages");
static_assert(kRows == 64, "one warpgroup's wgmma covers 64 rows");
static_assert(kHopperFlashThreads == 256, "two warpgroups");
// What an instantiation adds to the kernel. kNone is the product. The others are the benchmark's
// instruments (plans/0004): kTimeline writes clock stamps per CTA (layout below) and computes the
// same output; kNoGathers drops the ring's refills (halves after the first four are stale: the
// time of the math and the barriers alone) and kNoMath its wgmma (the time of the copies, the
// softmax and the barriers): both write garbage on purpose.
enum class Sm90Probe { kNone, kTimeline, kNoGathers, kNoMath };

// kTimeline's stamps, at timeline[blockIdx.x * kTimelineStride + ...]: [0] globaltimer ns at the
// start, [1] clock64 at the start, [2 + k] clock64 once warpgroup 0's half 2k (tile k's first
// half) is in (k < kTimelineTiles), [2 + T] before the epilogue, [3 + T] after it, [4 + T]
// globaltimer ns at the end, [5 + T] the SM id (T = kTimelineTiles), [6 + T] Q's copies issued,
// [7 + T] tiles 0 and 1 issued, [8 + T] Q landed; then, for tiles kPhaseFirstTile ..
// + kPhaseTiles - 1, the clock64 of each warpgroup's first thread at the kPhasePoints points of its
// own half of the tile (SmPhase), at [kPhaseBase + ((tile - kPhaseFirstTile) * 2 + warpgroup) *
// kPhasePoints + point].
inline constexpr int kTimelineTiles = 64;
inline constexpr int kPhaseFirstTile = 4;
inline constexpr int kPhaseTiles = 8;
// Points of a warpgroup's half, in the loop's order: at its top, its data in, S issued, the
// other's P V issued and S done, the reference maximum checked (and moved where a score passed
// it), P made, the own P V issued, P's buffer free (the other has read the last one), P published
// and the other's P V done, the refill's slot free (the other is done with it), the ring refilled
// (half h+4 issued or gathered; then the own P V's wait, up to the next top).
enum SmPhase {
  kTop,
  kHalfIn,
  kSIssued,
  kSDone,
  kMaxChecked,
  kPMade,
  kOwnPvIssued,
  kPBufferFree,
  kOtherPvDone,
  kSlotFree,
  kRefilled,
  kPhasePoints
};
inline constexpr int kPhaseBase = kTimelineTiles + 10;
inline constexpr int kTimelineStride = kPhaseBase + kPhaseTiles * 2 * kPhasePoints;

// Row `rr` of this warp's 8 rows of a half (32 columns from half_col) gathered by one warpgroup
// into a ring slot: warp w of the warpgroup takes rows 8w .. 8w+7, lane i the units i, i+32 and
// i+64 (those < 72) of the row; slot_word = the slot of column half_col + lane. Columns past
// col_end are zero-filled.
__device__ __forceinline__ void LoadKvHalfRow(const bf16_bits* kv, int slot_word, int half_col,
                                              int col_end, uint32_t dst, int wg_warp, int lane,
                                              int rr) {
  const int r = wg_warp * 8 + rr;
  const int slot = __shfl_sync(kFullMask, slot_word, r);
  const bool valid = half_col + r < col_end;
  const bf16_bits* src_row = kv + (valid ? static_cast<int64_t>(slot) * kKvDim : 0);
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const int u = lane + 32 * j;
    if (u < kUnitsPerRow) {
      CpAsync16(dst + (u >> 3) * kHalfChunkBytes + SwizzledOffset(r, u & 7),
                src_row + (valid ? u * 8 : 0), valid);
    }
  }
}

// A whole half in one burst (the prologue's, and a refill that is not one run).
__device__ __forceinline__ void LoadKvHalf(const bf16_bits* kv, int slot_word, int half_col,
                                           int col_end, uint32_t dst, int wg_warp, int lane) {
#pragma unroll
  for (int rr = 0; rr < 8; ++rr) {
    LoadKvHalfRow(kv, slot_word, half_col, col_end, dst, wg_warp, lane, rr);
  }
}

// The shared-memory address of ring slot `slot` (0..4).
__device__ __forceinline__ uint32_t RingSlot(uint32_t smem_base, int slot) {
  return slot < 4 ? smem_base + kKvOffset + slot * kHalfBytes : smem_base + kQOffset;
}

// Shared-window stores and loads (the generic ones the compiler emits for a pointer into the
// aligned dynamic shared memory cost an address conversion each).
__device__ __forceinline__ void StShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void StSharedF32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ uint32_t LdShared32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float LdSharedF32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// O's accumulator rows times a factor each: o[4i], o[4i+1] are row g of the warp, o[4i+2], o[4i+3]
// row g + 8 (the wgmma m64n256 accumulator layout).
__device__ __forceinline__ void ScaleRows(float (&o)[128], const float (&factor)[2]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[4 * i] *= factor[0];
    o[4 * i + 1] *= factor[0];
    o[4 * i + 2] *= factor[1];
    o[4 * i + 3] *= factor[1];
  }
}

// Whether the half from half_col is one run of 32 consecutive slots (run_base, run_base + 1, ...)
// before col_end, from the slot word every lane holds (column half_col + lane). Warp-uniform.
__device__ __forceinline__ bool HalfIsOneRun(int word, int lane, int run_base, int half_col,
                                             int col_end) {
  return half_col + kHalfCols <= col_end && __all_sync(kFullMask, word == run_base + lane);
}

// A half that is one run: one bulk tensor copy (box 64 dims x 32 slots x 9 chunks, kv_tile_map.h)
// into ring slot `dst`, completing on `bar`. One thread.
__device__ __forceinline__ void IssueHalfCopy(const void* map, int run_base, uint32_t dst,
                                              uint32_t bar) {
  tma::MbarrierArriveExpectTx(bar, kHalfBytes);
  tma::TensorCopy3d(dst, map, 0, run_base, 0, bar);
}

// A ring slot's barrier expects its owner warpgroup's 128 threads. By copy: the first thread's
// arrival announces the bytes and issues the copy, the other 127 arrive plainly (wg_tid: the
// thread's index in its warpgroup).
__device__ __forceinline__ void CopyHalfByOwner(const void* map, int run_base, uint32_t dst,
                                                uint32_t bar, int wg_tid) {
  if (wg_tid == 0) {
    IssueHalfCopy(map, run_base, dst, bar);
  } else {
    tma::MbarrierArrive(bar);
  }
}

// By gather: each of the owner's threads arrives once its own copies have landed.
__device__ __forceinline__ void GatherHalfByOwner(const bf16_bits* kv, int slot_word, int half_col,
                                                  int col_end, uint32_t dst, uint32_t bar,
                                                  int wg_warp, int lane) {
  LoadKvHalf(kv, slot_word, half_col, col_end, dst, wg_warp, lane);
  tma::CpAsyncMbarrierArriveNoInc(bar);
}

__device__ __forceinline__ int SlotAt(const int32_t* slots, int col, int col_end) {
  return col < col_end ? slots[col] : 0;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// 2^(ref - common) for a reference that moves to `common` (>= ref): exactly 1 if it stays.
__device__ __forceinline__ float RebaseFactor(float ref, float common) {
  return ref == common ? 1.f : Exp2Ftz(ref - common);
}

// S of this warpgroup's 32 columns (from col0) in log2 units, -inf where a row cannot see the
// column; tile_max = this thread's maximum of each of its two rows. Two loops rather than a test
// per value: only the columns that reach the tree or col_end read the mask (v18: the per-value
// branch cost instruction-cache misses on every tile). s[4i + e]: row wrow + g + 8 (e >> 1),
// column col0 + 8i + 2c + (e & 1).
__device__ __forceinline__ void ScaleAndMask(float (&s)[16], float (&tile_max)[2], int col0,
                                             int prefix_len, int col_end, float scale_log2,
                                             const int (&my_node)[2], const uint64_t* mask_rows,
                                             int words_per_row, int c) {
  tile_max[0] = tile_max[1] = -INFINITY;
  if (col0 + 32 <= prefix_len && col0 + 32 <= col_end) {
#pragma unroll
    for (int v = 0; v < 16; ++v) {
      s[v] *= scale_log2;
      tile_max[(v >> 1) & 1] = fmaxf(tile_max[(v >> 1) & 1], s[v]);
    }
  } else {
#pragma unroll
    for (int v = 0; v < 16; ++v) {
      const int h = (v >> 1) & 1;
      const int t = col0 + 8 * (v >> 2) + 2 * c + (v & 1);
      const bool visible =
          t < col_end &&
          (t < prefix_len ||
           (my_node[h] >= 0 && ColumnVisible(mask_rows, words_per_row, prefix_len, my_node[h], t)));
      s[v] = visible ? s[v] * scale_log2 : -INFINITY;
      tile_max[h] = fmaxf(tile_max[h], s[v]);
    }
  }
}

// Lazy maximum: a row's reference moves only when a score passes it by more than kMaxSlackLog2,
// so P <= 2^kMaxSlackLog2 and the warpgroups rarely need each other's maxima. Warp-uniform.
__device__ __forceinline__ bool MaxMustMove(const float (&tile_max)[2], const float (&row_max)[2]) {
  return __any_sync(kFullMask, tile_max[0] > row_max[0] + kMaxSlackLog2 ||
                                   tile_max[1] > row_max[1] + kMaxSlackLog2);
}

// Moves this warp's references to the rows' maxima and rescales its O and sums to them.
__device__ __forceinline__ void MoveReference(const float (&tile_max)[2], float (&row_max)[2],
                                              float (&row_sum)[2], float (&o)[128]) {
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 1));
    m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 2));
    const float new_max = fmaxf(row_max[h], m);
    alpha[h] = new_max == -INFINITY ? 1.f : Exp2Ftz(row_max[h] - new_max);
    row_max[h] = new_max;
    row_sum[h] *= alpha[h];
  }
  ScaleRows(o, alpha);
}

// P = 2^(S - reference) as wgmma A fragments (16 tokens per k-step: accumulator column groups 2k
// and 2k + 1, rows g and g + 8 of the warp), its sums added to row_sum.
__device__ __forceinline__ void MakeP(const float (&s)[16], const float (&row_max)[2],
                                      float (&row_sum)[2], uint32_t (&p_frag)[2][4]) {
  float base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // A row that has seen nothing yet keeps max -inf; subtracting 0 then keeps exp2 finite.
    base[h] = row_max[h] == -INFINITY ? 0.f : row_max[h];
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float p0 = Exp2Ftz(s[4 * i + 2 * h] - base[h]);
      const float p1 = Exp2Ftz(s[4 * i + 2 * h + 1] - base[h]);
      sum[h] += p0 + p1;
      p_frag[i >> 1][(i & 1) * 2 + h] = mma::PackBf16x2(p0, p1);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) row_sum[h] += sum[h];
}

// This warpgroup's P (tokens 32w .. 32w+31 of the P chunk) to shared memory for the other: row
// wrow + g + 8h, tokens 32w + 8i + 2c, +1 = unit 4w + i of the swizzled row, word c.
__device__ __forceinline__ void StoreP(const uint32_t (&p_frag)[2][4], uint32_t p_smem, int w,
                                       int wrow, int g, int c) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      StShared32(p_smem + SwizzledOffset(wrow + g + 8 * h, w * 4 + i) + 4 * c,
                 p_frag[i >> 1][(i & 1) * 2 + h]);
    }
  }
}

// This thread's rows to the other warpgroup's reference where it is higher (never lower: see
// run_halves), O and sums rescaled; the other's P then adds in as it is. Per thread: O's rows are
// this thread's own registers, and no shared memory changes, so no barrier is needed.
__device__ __forceinline__ void AdoptReference(const float (&other)[2], float (&row_max)[2],
                                               float (&row_sum)[2], float (&o)[128]) {
  if (other[0] == row_max[0] && other[1] == row_max[1]) return;
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    alpha[h] = RebaseFactor(row_max[h], other[h]);
    row_max[h] = other[h];
    row_sum[h] *= alpha[h];
  }
  ScaleRows(o, alpha);
}

// A register A operand is read asynchronously: its registers stay unclaimed until its wgmma is
// waited for.
__device__ __forceinline__ void PinFragments(uint32_t (&p_frag)[2][4]) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(p_frag[k][e])::"memory");
  }
}

// timeline: kTimeline's stamps; unused (nullptr) in every other instantiation.
template <Sm90Probe kProbe>
__global__ void __launch_bounds__(kHopperFlashThreads, 1)
    MlaVerifyFlashSm90Kernel(MlaVerifyParams params, const __grid_constant__ KvTileMap kv_map,
                             const __grid_constant__ KvTileMap q_map, uint64_t* timeline) {
  constexpr bool kTimeline = kProbe == Sm90Probe::kTimeline;
  constexpr bool kGathers = kProbe != Sm90Probe::kNoGathers;
  constexpr bool kMath = kProbe != Sm90Probe::kNoMath;
  // The combine (launched programmatically) may be scheduled onto each SM this CTA leaves; it
  // waits for this whole grid itself.
  pdl::AllowDependentLaunch();
  uint64_t* stamps = kTimeline ? timeline + blockIdx.x * kTimelineStride : nullptr;
  // kTimeline: this warpgroup's clock at point `point` of tile `tile` (its first thread only).
  auto stamp_phase = [&](int tile, int point) {
    if (kTimeline && (threadIdx.x & 127) == 0 && tile >= kPhaseFirstTile &&
        tile < kPhaseFirstTile + kPhaseTiles) {
      stamps[kPhaseBase + ((tile - kPhaseFirstTile) * 2 + (threadIdx.x >> 7)) * kPhasePoints +
             point] = clock64();
    }
  };
  if (kTimeline && threadIdx.x == 0) {
    stamps[0] = GlobalTimerNs();
    stamps[1] = clock64();
  }
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  const uint32_t smem_base = mma::SmemAddr(smem);
  const uint32_t q_smem = smem_base + kQOffset;
  const uint32_t p_smem = smem_base + kPOffset;
  const uint32_t published_ref = smem_base + kPublishedRefOffset;  // 2 x 64 fp32
  const uint32_t sum_xchg = smem_base + kSumXchgOffset;            // 2 x 64 fp32
  const uint32_t final_ref = smem_base + kFinalRefOffset;          // 2 x 64 fp32
  // The ring: half h waits on full_bar + 8 (h % 5); its owner arrives on done_bar + 8 (h % 5) once
  // its own products no longer read it.
  const uint32_t full_bar = smem_base + kRingBarOffset;
  const uint32_t done_bar = full_bar + 8 * kRingHalves;
  // P(w) and its reference published (p_full + 8w) / read by the other warpgroup (p_empty + 8w).
  const uint32_t p_full = smem_base + kPBarOffset;
  const uint32_t p_empty = p_full + 16;
  const uint32_t q_bar = p_full + 32;  // Q's copy (where Q comes by one)

  const VerifyProblem& pr = params.problem;
  const FlashWorkItem item = params.work[blockIdx.x];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  // Warpgroup (halves wg, wg + 2, ...; O columns 256wg..), broadcast from lane 0 so that the
  // compiler knows it is warp-uniform and keeps the wgmma descriptors built from it in uniform
  // registers (v18: without it every wgmma of S paid seven instructions of 64-bit moves).
  const int wg = __shfl_sync(kFullMask, tid >> 7, 0);
  const int wrow = (warp & 3) * 16;  // this warp's 16 rows of the 64
  const int g = lane >> 2;
  const int c = lane & 3;
  // The reference warpgroup w made its last P on, of this thread's row wrow + g + 8h.
  auto published_ref_at = [&](int w, int h) {
    return published_ref + 4 * (w * kRows + wrow + g + 8 * h);
  };

  const flash::ItemRows rows = flash::DecodeItem(pr, item);
  const int prefix_len = rows.prefix_len;
  const int rows_here = rows.rows_here;
  const int64_t first_row = rows.first_row;
  const int32_t* slots = rows.slots;
  const int heads = rows.heads;
  const int seq_rows = rows.seq_rows;
  const uint64_t* mask_rows = rows.mask_rows;
  const int words_per_row = rows.words_per_row;
  // The slot words of the first four halves (column + lane), loaded before anything that orders
  // memory: one dependent round trip for all four, not one each (v52: -2 us of the prologue).
  int first_words[4];
#pragma unroll
  for (int half = 0; half < 4; ++half) {
    first_words[half] = SlotAt(slots, item.col_begin + half * kHalfCols + lane, item.col_end);
  }

  if (tid == 0) {
#pragma unroll
    for (int b = 0; b < kRingHalves; ++b) {
      tma::MbarrierInit(full_bar + 8 * b, 128);
      tma::MbarrierInit(done_bar + 8 * b, 1);
    }
#pragma unroll
    for (int b = 0; b < 4; ++b) tma::MbarrierInit(p_full + 8 * b, 128);
    tma::MbarrierInit(q_bar, 1);
    tma::FenceMbarrierInit();
    if (kv_map.usable) tma::PrefetchTensorMap(&kv_map.map);
    // Q: one copy of the item's 64 rows into the 9 swizzled chunks (rows past the sequence come
    // as they are, the next sequence's or zero past the tensor, and are never written out).
    if (q_map.usable) {
      tma::MbarrierArriveExpectTx(q_bar, kTileBytes);
      tma::TensorCopy3d(q_smem, &q_map.map, 0, static_cast<int>(first_row), 0, q_bar);
    }
  }
  if (!q_map.usable) {
    // Fewer than 64 rows in the batch (no map): 16-byte copies; rows past the sequence are zero.
    for (int idx = tid; idx < kRows * kUnitsPerRow; idx += kHopperFlashThreads) {
      const int r = idx / kUnitsPerRow;
      const int u = idx % kUnitsPerRow;
      const bool valid = r < rows_here;
      CpAsync16(q_smem + (u >> 3) * kChunkBytes + SwizzledOffset(r, u & 7),
                valid ? pr.q + (first_row + r) * kKvDim + u * 8 : pr.q, valid);
    }
    CpAsyncCommit();
  }
  if (kTimeline && threadIdx.x == 0) stamps[6 + kTimelineTiles] = clock64();
  __syncthreads();  // the barriers initialised before any thread arrives on them

  // The two rows this thread holds in every accumulator: wrow + g and wrow + g + 8.
  int my_node[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = item.row_begin + wrow + g + 8 * h;
    my_node[h] = r < seq_rows ? r / heads : -1;
  }
  // The reference maximum of each row (lazy: see run_halves), this warpgroup's own; a P goes out
  // with the reference it was made on.
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};  // over this warpgroup's halves, this lane's quarter
  const float scale_log2 = pr.scale * kLog2e;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  const int num_halves = (item.col_end - item.col_begin + kHalfCols - 1) / kHalfCols;
  // Halves 0 and 1 (warpgroup k: half k) by a bulk copy where each is one run of 32 slots, else
  // gathered; halves 2 and 3 gathered here where they are not one run, else copied once Q has
  // landed (v49k: issued with Q and tile 0, they slowed the landing every CTA waits for). Bit k of
  // prologue_gathered: half k was gathered here (its owner fences before its wgmma read it).
  uint32_t prologue_gathered = 0;
  int copy_base = -1;  // warpgroup k: the run of half 2 + k, copied after the prologue's barrier
#pragma unroll
  for (int half = 0; half < 4; ++half) {
    if (half >= num_halves) break;
    const int half_col = item.col_begin + half * kHalfCols;
    const int word = first_words[half];
    const int run_base = __shfl_sync(kFullMask, word, 0);
    const uint32_t bar = full_bar + 8 * half;
    if (kv_map.usable && HalfIsOneRun(word, lane, run_base, half_col, item.col_end)) {
      if (wg == (half & 1)) {
        if (half >= 2) {
          copy_base = run_base;
        } else {
          CopyHalfByOwner(&kv_map.map, run_base, RingSlot(smem_base, half), bar, tid & 127);
        }
      }
    } else {
      if (wg == (half & 1)) {
        GatherHalfByOwner(pr.kv, word, half_col, item.col_end, RingSlot(smem_base, half), bar,
                          warp & 3, lane);
      }
      prologue_gathered |= 1u << half;
    }
  }
  if (kTimeline && threadIdx.x == 0) stamps[7 + kTimelineTiles] = clock64();

  // Q as S's A operand where it comes from shared memory (K-major, 128-byte swizzle, rows 0..63).
  const uint64_t q_desc = wgmma::MakeDescriptor(q_smem, 16, 1024);
  // Q's first kQRegSteps k-steps as this warp's A fragments (rows wrow .. wrow+15), read once Q has
  // landed: lane l addresses row wrow + (l & 15), 16-byte unit 2 (ks % 4) + (l >> 4) of chunk
  // ks / 4.
  uint32_t q_frag[kQRegSteps][4];
  if (q_map.usable) {
    tma::MbarrierWait(q_bar, 0);
  } else {
    CpAsyncWaitAll();
    wgmma::FenceProxyAsyncShared();  // Q is also read by the wgmma (chunks from kQRegSteps / 4)
    __syncthreads();
  }
  if (kTimeline && threadIdx.x == 0) stamps[8 + kTimelineTiles] = clock64();
#pragma unroll
  for (int ks = 0; ks < kQRegSteps; ++ks) {
    mma::LdMatrixX4(q_frag[ks], q_smem + (ks / 4) * kChunkBytes +
                                    SwizzledOffset(wrow + (lane & 15), 2 * (ks % 4) + (lane >> 4)));
  }

  // The loop: the warpgroups take alternate 32-column halves (warpgroup w the halves h = w, w + 2,
  // ...) and run half a step apart, so that one's softmax runs under the other's S. For its half h
  // a warpgroup waits for the half's data, issues S (64 x 32), then the P V of the other's half h-1
  // over its own 256 dims (P from shared memory, published with the reference it was made on),
  // waits for S, runs the softmax, issues the P V of its own half (P from registers), publishes
  // P(h), and refills the ring while that P V runs: half h+4 goes into the slot of half h-1, which
  // both warpgroups are done with by then. Ring: five 36 KB halves (the two 64-row stages as four
  // halves, and Q's first five chunks, whose k-steps live in registers after the prologue), so a
  // half's copies have about one round of both warpgroups to land.
  auto run_halves = [&]() {
    const uint64_t p_desc = wgmma::MakeDescriptor(p_smem, 16, 1024);
    // The slot word (column + lane) of the half this warpgroup refills next (h + 4).
    int refill_word = SlotAt(slots, item.col_begin + (wg + 4) * kHalfCols + lane, item.col_end);
    // Bit k: this warpgroup's own half h + 2k (h the current one) was gathered (cp.async).
    uint32_t gathered_ahead =
        ((prologue_gathered >> wg) & 1u) | ((prologue_gathered >> wg) & 4u) >> 1;
    // O += P(hp) V(hp) over this warpgroup's dims, P(hp) being the other warpgroup's (in shared
    // memory, made on the reference it published with it). That reference is never below this
    // warpgroup's: the other made P(hp) after adding this one's P(hp-1) (adopting its reference
    // where higher), and this one has not moved its own since publishing P(hp-1). So the rows
    // where the two differ (rare: after the other moved) adopt the other's, and P adds in as is.
    auto issue_other_pv = [&](int hp) {
      // The other's P number (hp - (1 - wg)) / 2 completes that phase of its barrier.
      tma::MbarrierWait(p_full + 8 * (1 - wg), ((hp - (1 - wg)) / 2) & 1);
      float other[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) other[h] = LdSharedF32(published_ref_at(1 - wg, h));
      AdoptReference(other, row_max, row_sum, o);
      wgmma::PinRegisters(o);
      wgmma::Fence();
      const uint64_t v_desc = wgmma::MakeDescriptor(
          RingSlot(smem_base, hp % kRingHalves) + wg * 4 * kHalfChunkBytes, kHalfChunkBytes, 1024);
      if (kMath) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          wgmma::MmaM64N256K16TransB(o, wgmma::AdvanceDescriptor(p_desc, (2 * (1 - wg) + k) * 32),
                                     wgmma::AdvanceDescriptor(v_desc, k * 16 * 128));
        }
      }
      wgmma::Commit();
    };
    for (int h = wg; h < num_halves; h += 2) {
      const int slot = h % kRingHalves;
      const uint32_t half_smem = RingSlot(smem_base, slot);
      const int half_col = item.col_begin + h * kHalfCols;
      const int next_refill_word = SlotAt(slots, half_col + 6 * kHalfCols + lane, item.col_end);
      stamp_phase(h / 2, kTop);
      if (kGathers || h < 4) tma::MbarrierWait(full_bar + 8 * slot, (h / kRingHalves) & 1);
      // A gathered half came by cp.async (the generic proxy); this warpgroup gathered it itself
      // (in the prologue or as the refiller of half h, who is its owner), so it knows.
      if (gathered_ahead & 1) wgmma::FenceProxyAsyncShared();
      gathered_ahead >>= 1;
      if (kTimeline && threadIdx.x == 0 && h / 2 < kTimelineTiles) stamps[2 + h / 2] = clock64();
      stamp_phase(h / 2, kHalfIn);

      float s[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = 0.f;
      wgmma::PinRegisters(s);
      wgmma::Fence();
      const uint64_t k_desc = wgmma::MakeDescriptor(half_smem, 16, 1024);
#pragma unroll
      for (int ks = 0; ks < kKvDim / 16; ++ks) {
        const uint32_t q_off = (ks / 4) * kChunkBytes + (ks % 4) * 32;
        const uint32_t k_off = (ks / 4) * kHalfChunkBytes + (ks % 4) * 32;
        if (kMath && ks < kQRegSteps) {
          wgmma::MmaM64N32K16RegA(s, q_frag[ks < kQRegSteps ? ks : 0],
                                  wgmma::AdvanceDescriptor(k_desc, k_off));
        } else if (kMath) {
          wgmma::MmaM64N32K16(s, wgmma::AdvanceDescriptor(q_desc, q_off),
                              wgmma::AdvanceDescriptor(k_desc, k_off));
        }
      }
      wgmma::Commit();
      stamp_phase(h / 2, kSIssued);
      if (h >= 1) {
        issue_other_pv(h - 1);
        wgmma::WaitAllButNewest();  // S(h); the other's P V may still run
      } else {
        wgmma::WaitAll();
      }
      wgmma::PinRegisters(s);
      stamp_phase(h / 2, kSDone);

      float tile_max[2];
      ScaleAndMask(s, tile_max, half_col, prefix_len, item.col_end, scale_log2, my_node, mask_rows,
                   words_per_row, c);
      if (MaxMustMove(tile_max, row_max)) {
        wgmma::WaitAll();  // the other's P V adds into O
        wgmma::PinRegisters(o);
        MoveReference(tile_max, row_max, row_sum, o);
      }
      stamp_phase(h / 2, kMaxChecked);

      uint32_t p_frag[2][4];
      MakeP(s, row_max, row_sum, p_frag);
      stamp_phase(h / 2, kPMade);
      // The own P V first (P from registers), so that the tensor cores have it while P goes out.
      wgmma::PinRegisters(o);
      wgmma::Fence();
      const uint64_t v_desc =
          wgmma::MakeDescriptor(half_smem + wg * 4 * kHalfChunkBytes, kHalfChunkBytes, 1024);
      if (kMath) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          wgmma::MmaM64N256K16RegATransB(o, p_frag[k],
                                         wgmma::AdvanceDescriptor(v_desc, k * 16 * 128));
        }
      }
      wgmma::Commit();
      stamp_phase(h / 2, kOwnPvIssued);
      // P(h-2) and its reference were read by the other warpgroup before it let this one reuse
      // them.
      if (h >= wg + 2) tma::MbarrierWait(p_empty + 8 * wg, ((h - wg) / 2 - 1) & 1);
      stamp_phase(h / 2, kPBufferFree);
      StoreP(p_frag, p_smem, wg, wrow, g, c);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        if (c == 0) StSharedF32(published_ref_at(wg, hh), row_max[hh]);
      }
      wgmma::FenceProxyAsyncShared();
      tma::MbarrierArrive(p_full + 8 * wg);
      // The other's P(h-1) V(h-1) done (the own P V may still run): its P is read, so it may write
      // its next one (if it has one), and this side is done with the slot of h-1.
      wgmma::WaitAllButNewest();
      stamp_phase(h / 2, kOtherPvDone);
      if (h >= 1 && h + 1 < num_halves) tma::MbarrierArrive(p_empty + 8 * (1 - wg));
      // Refill: half h+4 into the slot of half h-1 (this warpgroup's P V of it is done; the other's
      // S and P V of it, done_bar).
      if (kGathers && h + 4 < num_halves) {
        const int refill_slot = (h + 4) % kRingHalves;
        const uint32_t refill_smem = RingSlot(smem_base, refill_slot);
        const uint32_t refill_bar = full_bar + 8 * refill_slot;
        if (h >= 1) tma::MbarrierWait(done_bar + 8 * refill_slot, ((h - 1) / kRingHalves) & 1);
        stamp_phase(h / 2, kSlotFree);
        const int refill_col = half_col + 4 * kHalfCols;
        const int run_base = __shfl_sync(kFullMask, refill_word, 0);
        if (kv_map.usable && HalfIsOneRun(refill_word, lane, run_base, refill_col, item.col_end)) {
          CopyHalfByOwner(&kv_map.map, run_base, refill_smem, refill_bar, tid & 127);
        } else {
          // Not one run (the tree's columns, the range's end, a fragmented pool): gathered.
          GatherHalfByOwner(pr.kv, refill_word, refill_col, item.col_end, refill_smem, refill_bar,
                            warp & 3, lane);
          gathered_ahead |= 2u;  // half h + 4: two own halves on (the shift is at the loop's top)
        }
      }
      stamp_phase(h / 2, kRefilled);
      wgmma::WaitAll();  // the own P V: S(h) and P V(h) are done with the slot of h
      wgmma::PinRegisters(o);
      PinFragments(p_frag);
      if ((tid & 127) == 0) tma::MbarrierArrive(done_bar + 8 * slot);
      refill_word = next_refill_word;
    }
    // The other warpgroup's last half, if it has the last one.
    if ((num_halves - 1) % 2 != wg) {
      issue_other_pv(num_halves - 1);
      wgmma::WaitAll();
      wgmma::PinRegisters(o);
    }
  };
  __syncthreads();  // every warp's Q fragments read before half 4 overwrites Q's first chunks
  // Halves 2 and 3 by copy: issued only now, so that they do not slow the landing of Q and tile 0
  // that every CTA waits for at once (v49k).
  if (copy_base >= 0) {
    CopyHalfByOwner(&kv_map.map, copy_base, RingSlot(smem_base, 2 + wg), full_bar + 8 * (2 + wg),
                    tid & 127);
  }
  run_halves();

  if (kTimeline && threadIdx.x == 0) stamps[2 + kTimelineTiles] = clock64();
  CpAsyncWaitAll();  // (each gathered half was waited for by its owner: a guard before the stage)
  // Row sums (this lane's quarter, then the quad) and references of both warpgroups (the two may
  // differ); the sum adds warpgroup 0 first, so every run adds in the same order.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float x = row_sum[h];
    x += __shfl_xor_sync(kFullMask, x, 1);
    x += __shfl_xor_sync(kFullMask, x, 2);
    if (c == 0) {
      StSharedF32(sum_xchg + 4 * (wg * kRows + wrow + g + 8 * h), x);
      StSharedF32(final_ref + 4 * (wg * kRows + wrow + g + 8 * h), row_max[h]);
    }
  }
  __syncthreads();

  // The LSE of each row (one writer per row), and the row's 1/sum for the O scaling below.
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wrow + g + 8 * h;
    const float ref0 = LdSharedF32(final_ref + 4 * r);
    const float ref1 = LdSharedF32(final_ref + 4 * (kRows + r));
    const float common = fmaxf(ref0, ref1);
    const float total = LdSharedF32(sum_xchg + 4 * r) * RebaseFactor(ref0, common) +
                        LdSharedF32(sum_xchg + 4 * (kRows + r)) * RebaseFactor(ref1, common);
    inv[h] = total > 0.f ? RebaseFactor(row_max[h], common) / total : 0.f;
    if (r < rows_here && wg == 0 && c == 0) {
      flash::WriteLse(params, item, first_row, r, flash::RowLse(common, total));
    }
  }
  // Staged: the rows go to shared memory (the KV stages are free: no gather is in flight and every
  // wgmma has completed), then leave as one bulk copy per row.
  const uint32_t stage = smem_base + kKvOffset;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wrow + g + 8 * h;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int col = wg * 256 + 8 * i + 2 * c;
      const float x0 = o[4 * i + 2 * h] * inv[h];
      const float x1 = o[4 * i + 2 * h + 1] * inv[h];
      StShared32(stage + r * flash::kStageStride + col * 2, mma::PackBf16x2(x0, x1));
    }
  }
  uint8_t* dst = flash::OutRows(params, item, first_row);
  wgmma::FenceProxyAsyncShared();  // st.shared above, read by the async (bulk copy) proxy
  __syncthreads();
  if (tid < rows_here) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                     dst + static_cast<int64_t>(tid) * flash::kOutRowBytes),
                 "r"(smem_base + kKvOffset + tid * flash::kStageStride), "r"(flash::kOutRowBytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    // Until the stage has been read, not until the rows have landed: the kernel's end makes them
    // visible to the combine.
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  }
  if (kTimeline) {
    __syncthreads();
    if (threadIdx.x == 0) {
      stamps[3 + kTimelineTiles] = clock64();
      stamps[4 + kTimelineTiles] = GlobalTimerNs();
      uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      stamps[5 + kTimelineTiles] = sm;
    }
  }
}

}  // namespace verifyd::flash_sm90
