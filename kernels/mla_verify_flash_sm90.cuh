// The flash MLA tree-verify kernel, Hopper path (sm_90a only: wgmma). Same work items, mask
// semantics, outputs and split partials as the portable kernel (mla_verify_flash.cu); the
// launcher picks this one on a compute-capability-9 device when this sm_90a image is present.
// The kernel is a template over Sm90Probe so that the benchmark can build its instruments from
// this same source: mla_verify_flash_sm90.cu instantiates Sm90Probe::kNone alone (the product);
// tools/bench/mla_verify_flash_sm90_probes.cu the others (never linked into the product).
//
// Math (SPEC §1): rows r = node * H + head of one sequence, columns t = 0 .. L+Q-1 (prefix, then
// tree nodes); S = scale * Q K^T, -inf where node(r) cannot see t; O = softmax(S) V, LSE = ln sum
// exp(S). Online softmax in fp32 in log2 units, 64 KV columns per tile.
//
// Tiling. One CTA = one work item = 64 rows x a column range. Two warpgroups (256 threads):
// - S (64 x 64 per tile, k = 576): warpgroup w computes the 32 columns 32w .. 32w+31 with 36
//   wgmma m64n32k16, B = K from shared memory, A = Q from shared memory except for the first
//   kQRegSteps k-steps, whose A fragments each warp holds in registers for the whole item (80
//   registers: the kernel uses 255, no spills).
// - Softmax: each warpgroup has all 64 rows of its 32 columns. Both hold the same reference maximum
//   per row, which moves lazily: only when a score passes it by more than kMaxSlackLog2 (so P <=
//   2^8). On almost every tile neither warpgroup needs the other's maxima, and the only exchange is
//   P itself; a warp whose rows passed moves its own reference and rescales its O and sums, and the
//   P barrier's OR tells both warpgroups to settle on the larger reference of each row (the rarely
//   taken path: each rescales its O and the other's P in shared memory). v34, plans/0004: the
//   lock step's max-exchange barrier cost 6-11 % per call. Each keeps the row sum of its own
//   columns; the two sums are added once, after the last tile.
// - O (64 x 512 fp32, 128 KB) is split by d_v: warpgroup w owns O[:, 256w .. 256w+256) for all 64
//   rows, 128 accumulator registers per thread. 4 wgmma m64n256k16 per tile, B = V read MN-major
//   (transposed) from the same KV tile that served as K: the two over this warpgroup's own 32
//   tokens take A = P from registers and are issued before the barrier that publishes P; the two
//   over the other warpgroup's 32 take A from shared memory (P goes there for that reason).
//   Why split d_v rather than two passes over the KV: a second pass would read every KV tile twice
//   from device memory and recompute S; splitting d_v costs only the P exchange (8 KB per tile).
//
// Shared memory (wgmma_sm90.cuh: 64-row x 128-byte chunks, 128-byte swizzle, 1024-byte aligned):
//   Q       9 chunks (576 dims)                                     73728 B
//   KV      2 stages x 9 chunks (64 tokens x 576 dims)             147456 B
//   P       1 chunk (64 rows x 64 tokens)                             8192 B
//   reference max of each row per warpgroup 2 x 64 fp32, row sums 2 x 64  1024 B
//   one mbarrier per KV stage (the bulk copies complete on it)            16 B
//   total 230416 B (+1024 for aligning the base) of the 232448 B an H200 block may take.
//
// Pipeline per tile: wait for tile j (cp.async, and its stage's mbarrier when it came by bulk
// copies), fence to the async proxy, barrier; start tile j+1 into the other stage; issue the 36 S
// wgmma; then the slot-table load for tile j+2; wait for S; mask (a separate loop for the tiles
// that reach the tree or col_end); move the reference maximum where a score passed it (rare: with
// O's rescale); P to shared memory; P V over its own tokens (registers); P barrier with the OR of
// "a reference moved" (if so, both settle on a common one: see Softmax); P V over the other
// warpgroup's tokens; wait. KV rows come through the int32 slot table (page size 1); columns past
// col_end are zero-filled so a masked column never multiplies garbage. How tile j+1 arrives depends
// on the item, decided once from its tile 1 (two instantiations of the loop; plans/0004 v32):
// - gathered (the item's tile 1 is not 64 consecutive slots, e.g. a fragmented pool): each warp
//   gathers 8 rows by 16-byte cp.async, one row after every fourth S wgmma (the warps stall on the
//   tensor cores there anyway; issued after the last wgmma the gather sat on the critical path:
//   v18, 16 % of the stall samples at S1); on the last tile it zero-fills the idle stage;
// - by copy (tile 1 is one run, as compaction leaves most sequences): a next tile that is one run
//   of 64 slots before col_end comes by 9 bulk tensor copies (TMA, box 64 slots x 64 dims, the
//   128-byte swizzle of the operand chunks; kv_tile_map.h) issued by one thread, and S runs with
//   nothing woven in; any other tile of such an item (the tree's columns, the end of the range) is
//   gathered in one burst before S. Measured against the gathered form on the same layouts: 4-8 %
//   faster on every shape when it came (v32d), 4-19 % since v34 shortened the tile. Thread 0 issues
//   the copies at the tile's top, so that they land under the softmax and the P barrier: spread
//   over warps or both warpgroups, after S, woven among its wgmma, as one 3-D copy, or each chunk
//   as soon as it is free (landing under P V) they cost more (v35-v38, v40, v47, v48). One form
//   per item, not per tile: a loop holding both S sequences made the gathered form itself 4-7 %
//   slower (v32a), and a branch among the S wgmma fences them (v31, v32p).
//
// Epilogue: O / rowsum, as bf16 (the output, or a split's partial), goes to shared memory (the two
// KV stages are free by then: 64 rows padded to 1056 B) and leaves as one bulk copy
// (cp.async.bulk) per row. Measured on the H200 (v10, fp32 partials then): the direct 8-byte
// stores from the accumulators took ~14 us per CTA when all CTAs end together (132 x 128 KB of
// partials), 16-byte coalesced stores from the stage ~5.5 us, the bulk copies ~5 us; the other two
// were deleted.
//
// Launch: as usual; its first statement lets the combine, launched programmatically behind it
// (programmatic_launch.cuh), be scheduled, so the combine's CTAs start on each SM this grid leaves
// (v30, plans/0004: -1.5 us per call at S1).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/mla_verify_flash_common.cuh"
#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_mma.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/kv_tile_map.h"
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

constexpr int kCols = 64;  // KV columns per tile
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
constexpr int kMaxXchgOffset = kPOffset + kChunkBytes;
constexpr int kSumXchgOffset = kMaxXchgOffset + 2 * kRows * 4;
constexpr int kCopyBarOffset = kSumXchgOffset + 2 * kRows * 4;  // one mbarrier per KV stage
constexpr int kSmemUsed = kCopyBarOffset + 2 * 8;
constexpr int kSmemBytes = kSmemUsed + 1024;  // room to align the base to 1024
static_assert(kSmemBytes <= 232448, "an sm_90 block may take 227 KB of dynamic shared memory");
static_assert(kRows * flash::kStageStride <= 2 * kTileBytes,
              "the staged epilogue fits the KV stages");
static_assert(kRows == 64, "one warpgroup's wgmma covers 64 rows");
static_assert(kHopperFlashThreads == 256, "two warpgroups");

// What an instantiation adds to the kernel. kNone is the product. The others are the benchmark's
// instruments (plans/0004): kTimeline writes clock stamps per CTA (layout below) and computes the
// same output; kNoGathers drops the main loop's KV gathers (tiles after the first are stale: the
// time of the math and the barriers alone) and kNoMath its wgmma (the time of the gathers, the
// softmax and the barriers): both write garbage on purpose.
enum class Sm90Probe { kNone, kTimeline, kNoGathers, kNoMath };

// kTimeline's stamps, at timeline[blockIdx.x * kTimelineStride + ...]: [0] globaltimer ns at the
// start, [1] clock64 at the start, [2 + k] clock64 once tile k's data is in (k < kTimelineTiles),
// [2 + T] before the epilogue, [3 + T] after it, [4 + T] globaltimer ns at the end, [5 + T] the SM
// id (T = kTimelineTiles); then, for tiles kPhaseFirstTile .. + kPhaseTiles - 1, the clock64 of
// each warpgroup's first thread at the kPhasePoints points of a tile (SmPhase), at [kPhaseBase +
// ((tile - kPhaseFirstTile) * 2 + warpgroup) * kPhasePoints + point].
inline constexpr int kTimelineTiles = 64;
inline constexpr int kPhaseFirstTile = 4;
inline constexpr int kPhaseTiles = 8;
// Points of a tile: the tile barrier passed, S issued, S done, the reference maximum checked (and
// moved where a score passed it), the own tokens' P V issued, the P barrier (and the rare settling
// of the references) passed, P V done.
enum SmPhase {
  kTileIn,
  kSIssued,
  kSDone,
  kMaxChecked,
  kOwnPvIssued,
  kPShared,
  kPvDone,
  kPhasePoints
};
inline constexpr int kPhaseBase = kTimelineTiles + 10;
inline constexpr int kTimelineStride = kPhaseBase + kPhaseTiles * 2 * kPhasePoints;

// Gathers row `rr` of this warp's 8 rows (8w .. 8w+7) of KV columns [tile_col, tile_col + 64) into
// one stage: lane i copies units i, i+32, i+64 (< 72) of the row. slot_lo / slot_hi = the slots of
// columns tile_col + lane and tile_col + 32 + lane, loaded a tile ahead. Columns past col_end are
// zero-filled. The tile's 8 rows are issued between the S wgmma (see the main loop).
__device__ __forceinline__ void LoadKvRow(const bf16_bits* kv, int slot_lo, int slot_hi,
                                          int tile_col, int col_end, uint32_t dst, int warp,
                                          int lane, int rr) {
  const int r = warp * 8 + rr;
  const int slot = __shfl_sync(kFullMask, r < 32 ? slot_lo : slot_hi, r & 31);
  const bool valid = tile_col + r < col_end;
  const bf16_bits* src_row = kv + (valid ? static_cast<int64_t>(slot) * kKvDim : 0);
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const int u = lane + 32 * j;
    if (u < kUnitsPerRow) {
      CpAsync16(dst + (u >> 3) * kChunkBytes + SwizzledOffset(r, u & 7),
                src_row + (valid ? u * 8 : 0), valid);
    }
  }
}

// A whole tile in one burst (the prologue's, and the by-copy form's tiles that are not one run): all
// 8 rows of this warp, one commit group.
__device__ __forceinline__ void LoadKvTile(const bf16_bits* kv, int slot_lo, int slot_hi,
                                           int tile_col, int col_end, uint32_t dst, int warp,
                                           int lane) {
#pragma unroll
  for (int rr = 0; rr < 8; ++rr) {
    LoadKvRow(kv, slot_lo, slot_hi, tile_col, col_end, dst, warp, lane, rr);
  }
  CpAsyncCommit();
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

// Whether a tile is one run of 64 consecutive slots (run_base, run_base + 1, ...), from the slot words
// every warp holds for it (slot_lo = column lane, slot_hi = column 32 + lane). Warp-uniform.
__device__ __forceinline__ bool TileIsOneRun(int slot_lo, int slot_hi, int lane, int run_base) {
  return __all_sync(kFullMask, slot_lo == run_base + lane && slot_hi == run_base + 32 + lane);
}

__device__ __forceinline__ int SlotAt(const int32_t* slots, int col, int col_end) {
  return col < col_end ? slots[col] : 0;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// timeline: kTimeline's stamps; unused (nullptr) in every other instantiation.
template <Sm90Probe kProbe>
__global__ void __launch_bounds__(kHopperFlashThreads, 1)
    MlaVerifyFlashSm90Kernel(MlaVerifyParams params, const __grid_constant__ KvTileMap kv_map,
                             uint64_t* timeline) {
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
  const uint32_t kv_smem = smem_base + kKvOffset;
  const uint32_t p_smem = smem_base + kPOffset;
  const uint32_t max_xchg = smem_base + kMaxXchgOffset;  // 2 x 64 fp32
  const uint32_t sum_xchg = smem_base + kSumXchgOffset;  // 2 x 64 fp32
  const uint32_t copy_bar = smem_base + kCopyBarOffset;  // 2 mbarriers, stage s at + 8s

  const VerifyProblem& pr = params.problem;
  const FlashWorkItem item = params.work[blockIdx.x];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  // Warpgroup: S columns 32wg.., O columns 256wg... Broadcast from lane 0 so that the compiler
  // knows it is warp-uniform and keeps the wgmma descriptors built from it in uniform registers
  // (v18: without it every wgmma of S paid seven instructions of 64-bit arithmetic and moves).
  const int wg = __shfl_sync(kFullMask, tid >> 7, 0);
  const int wrow = (warp & 3) * 16;  // this warp's 16 rows of the 64
  const int g = lane >> 2;
  const int c = lane & 3;
  // Warpgroup w's reference maximum of this thread's row wrow + g + 8h.
  auto ref_max_at = [&](int w, int h) { return max_xchg + 4 * (w * kRows + wrow + g + 8 * h); };

  const flash::ItemRows rows = flash::DecodeItem(pr, item);
  const int prefix_len = rows.prefix_len;
  const int rows_here = rows.rows_here;
  const int64_t first_row = rows.first_row;
  const int32_t* slots = rows.slots;
  const int heads = rows.heads;
  const int seq_rows = rows.seq_rows;
  const uint64_t* mask_rows = rows.mask_rows;
  const int words_per_row = rows.words_per_row;

  // Q: 64 rows x 72 units into 9 swizzled chunks; rows past the sequence are zero.
  for (int idx = tid; idx < kRows * kUnitsPerRow; idx += kHopperFlashThreads) {
    const int r = idx / kUnitsPerRow;
    const int u = idx % kUnitsPerRow;
    const bool valid = r < rows_here;
    CpAsync16(q_smem + (u >> 3) * kChunkBytes + SwizzledOffset(r, u & 7),
              valid ? pr.q + (first_row + r) * kKvDim + u * 8 : pr.q, valid);
  }
  CpAsyncCommit();
  if (kTimeline && threadIdx.x == 0) stamps[6 + kTimelineTiles] = clock64();
  if (tid == 0) {
    tma::MbarrierInit(copy_bar, 1);
    tma::MbarrierInit(copy_bar + 8, 1);
    tma::FenceMbarrierInit();
    if (kv_map.usable) tma::PrefetchTensorMap(&kv_map.map);
  }

  // The two rows this thread holds in every accumulator: wrow + g and wrow + g + 8.
  int my_node[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = item.row_begin + wrow + g + 8 * h;
    my_node[h] = r < seq_rows ? r / heads : -1;
  }
  // The reference maximum of each row (lazy: see the tile loop), the same in both warpgroups after
  // every tile; each warpgroup publishes its own in max_xchg for the other.
  float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (c == 0) StSharedF32(ref_max_at(wg, h), -INFINITY);
  }
  float row_sum[2] = {0.f, 0.f};  // over this warpgroup's columns, this lane's quarter
  const float scale_log2 = pr.scale * kLog2e;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  const int num_tiles = (item.col_end - item.col_begin + kCols - 1) / kCols;
  LoadKvTile(pr.kv, SlotAt(slots, item.col_begin + lane, item.col_end),
             SlotAt(slots, item.col_begin + 32 + lane, item.col_end), item.col_begin, item.col_end,
             kv_smem, warp, lane);
  if (kTimeline && threadIdx.x == 0) stamps[7 + kTimelineTiles] = clock64();
  int next_lo = SlotAt(slots, item.col_begin + kCols + lane, item.col_end);
  int next_hi = SlotAt(slots, item.col_begin + kCols + 32 + lane, item.col_end);

  // Descriptors (K-major, 128-byte swizzle): A = Q rows 0..63; B = K rows 32wg .. 32wg+31.
  const uint64_t q_desc = wgmma::MakeDescriptor(q_smem, 16, 1024);
  // Q's first kQRegSteps k-steps as this warp's A fragments (rows wrow .. wrow+15), read once Q has
  // landed: lane l addresses row wrow + (l & 15), 16-byte unit 2 (ks % 4) + (l >> 4) of chunk
  // ks / 4.
  uint32_t q_frag[kQRegSteps][4];
  CpAsyncWaitAll();
  __syncthreads();
  if (kTimeline && threadIdx.x == 0) stamps[8 + kTimelineTiles] = clock64();
#pragma unroll
  for (int ks = 0; ks < kQRegSteps; ++ks) {
    mma::LdMatrixX4(q_frag[ks], q_smem + (ks / 4) * kChunkBytes +
                                    SwizzledOffset(wrow + (lane & 15), 2 * (ks % 4) + (lane >> 4)));
  }

  // The tile loop comes in two forms, chosen once per item. Gathered (every item whose tile 1 is not
  // one run of 64 consecutive slots): each next tile is gathered between S's wgmma. By copy: a next
  // tile that is one run comes by 9 bulk tensor copies (TMA) issued by one thread, completed on its
  // stage's mbarrier, and S runs with no gather woven in; any other tile of such an item is gathered
  // in one burst. One form per item rather than per tile: both S sequences in one loop made the
  // gathered form 4-7 % slower (v32a, plans/0004), and a branch among the S wgmma fences them (v31).
  // copy_state bits 0-1: the parity of stage 0's / 1's mbarrier phase to wait for next; bit 2: the
  // tile now waited for came by copy (one register: the kernel has none to spare).
  uint32_t copy_state = 0;
  auto run_tiles = [&](auto copies) {
    constexpr bool kCopies = decltype(copies)::value;
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int tile_col = item.col_begin + tile * kCols;
      const uint32_t kv_tile = kv_smem + (tile & 1) * kTileBytes;
      CpAsyncWaitAll();
      if (kCopies && (copy_state & 4)) {
        tma::MbarrierWait(copy_bar + 8 * (tile & 1), (copy_state >> (tile & 1)) & 1);
        copy_state ^= 1u << (tile & 1);
      }
      wgmma::FenceProxyAsyncShared();
      __syncthreads();  // tile j (and Q) landed for all; both warpgroups are done with the other
                        // stage
      // Stamp k + 2: tile k's data is in (k = 0: the prologue, Q and the first tile, is over).
      if (kTimeline && threadIdx.x == 0 && tile < kTimelineTiles) stamps[2 + tile] = clock64();
      stamp_phase(tile, kTileIn);
      const uint32_t next_stage = kv_smem + ((tile + 1) & 1) * kTileBytes;
      const int next_col = tile_col + kCols;
      if constexpr (kCopies) {
        // Tile j+1 into the other stage (free since the barrier above): by 9 bulk copies from one
        // thread when it is one run of slots; otherwise gathered here in one burst (v29a: 4-6 % slower
        // than woven into S, but a rare tile in an item whose tile 1 was a run; and a branch among the
        // S wgmma would fence them, v31).
        copy_state &= 3;
        if (tile + 1 < num_tiles) {
          const int run_base = __shfl_sync(kFullMask, next_lo, 0);
          const bool one_run =
              next_col + kCols <= item.col_end && TileIsOneRun(next_lo, next_hi, lane, run_base);
          if (one_run) {
            if (tid == 0) {
              const uint32_t bar = copy_bar + 8 * ((tile + 1) & 1);
              tma::MbarrierArriveExpectTx(bar, kTileBytes);
  #pragma unroll
              for (int ch = 0; ch < kKvChunks; ++ch) {
                tma::TensorCopy2d(next_stage + ch * kChunkBytes, &kv_map.map, 64 * ch, run_base,
                                  bar);
              }
            }
            copy_state |= 4;
          } else {
            LoadKvTile(pr.kv, next_lo, next_hi, next_col, item.col_end, next_stage, warp, lane);
          }
        }
      }

      float s[16];
  #pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = 0.f;
      wgmma::PinRegisters(s);
      wgmma::Fence();
      const uint64_t k_desc =
          wgmma::MakeDescriptor(kv_tile + wg * 32 * wgmma::kSwizzleRowBytes, 16, 1024);
      // Tile j+1's gather goes between the S wgmma, one KV row of this warp after every fourth: the
      // warps wait on the tensor cores there anyway, and issued after the last wgmma it sat on the
      // critical path (v18, plans/0004: 16 % of the stall samples at S1). On the last tile it
      // zero-fills the idle stage (every column is past col_end); the epilogue waits for it.
  #pragma unroll
      for (int ks = 0; ks < kKvDim / 16; ++ks) {
        const uint32_t off = (ks / 4) * kChunkBytes + (ks % 4) * 32;
        if (kMath && ks < kQRegSteps) {
          wgmma::MmaM64N32K16RegA(s, q_frag[ks < kQRegSteps ? ks : 0],
                                  wgmma::AdvanceDescriptor(k_desc, off));
        } else if (kMath) {
          wgmma::MmaM64N32K16(s, wgmma::AdvanceDescriptor(q_desc, off),
                              wgmma::AdvanceDescriptor(k_desc, off));
        }
        if (!kCopies && kGathers && ks % 4 == 3 && ks / 4 < 8) {
          LoadKvRow(pr.kv, next_lo, next_hi, next_col, item.col_end, next_stage, warp, lane, ks / 4);
        }
      }
      wgmma::Commit();
      if (!kCopies) CpAsyncCommit();
      stamp_phase(tile, kSIssued);
      next_lo = SlotAt(slots, tile_col + 2 * kCols + lane, item.col_end);
      next_hi = SlotAt(slots, tile_col + 2 * kCols + 32 + lane, item.col_end);
      wgmma::WaitAll();
      wgmma::PinRegisters(s);
      stamp_phase(tile, kSDone);

      // s[4i + e]: row wrow + g + 8 (e >> 1), column 32wg + 8i + 2c + (e & 1) of the tile.
      const bool all_visible = tile_col + kCols <= prefix_len && tile_col + kCols <= item.col_end;
      float tile_max[2] = {-INFINITY, -INFINITY};  // over this thread's values of each row
      // Two loops rather than a test per value: only the tiles that reach the tree or col_end read
      // the mask (v18: the per-value branch cost instruction-cache misses on every tile).
      if (all_visible) {
  #pragma unroll
        for (int v = 0; v < 16; ++v) {
          s[v] *= scale_log2;
          tile_max[(v >> 1) & 1] = fmaxf(tile_max[(v >> 1) & 1], s[v]);
        }
      } else {
  #pragma unroll
        for (int v = 0; v < 16; ++v) {
          const int h = (v >> 1) & 1;
          const int t = tile_col + wg * 32 + 8 * (v >> 2) + 2 * c + (v & 1);
          const bool visible =
              t < item.col_end &&
              (t < prefix_len || (my_node[h] >= 0 && ColumnVisible(mask_rows, words_per_row,
                                                                   prefix_len, my_node[h], t)));
          s[v] = visible ? s[v] * scale_log2 : -INFINITY;
          tile_max[h] = fmaxf(tile_max[h], s[v]);
        }
      }
      // Lazy maximum: the reference row_max moves only when a score passes it by more than
      // kMaxSlackLog2, so P <= 2^kMaxSlackLog2 and, on almost every tile, neither warpgroup waits
      // for the other's maxima. A warp whose rows passed moves its own reference and rescales its O
      // and sums; the P barrier then tells both warpgroups (its OR) and they settle on a common
      // reference before P V reads the other's P.
      bool moved = false;
      if (__any_sync(kFullMask, tile_max[0] > row_max[0] + kMaxSlackLog2 ||
                                    tile_max[1] > row_max[1] + kMaxSlackLog2)) {
        float alpha[2];
  #pragma unroll
        for (int h = 0; h < 2; ++h) {
          float m = fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 1));
          m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 2));
          const float new_max = fmaxf(row_max[h], m);
          alpha[h] = new_max == -INFINITY ? 1.f : Exp2Ftz(row_max[h] - new_max);
          row_max[h] = new_max;
          row_sum[h] *= alpha[h];
          if (c == 0) StSharedF32(ref_max_at(wg, h), new_max);
        }
        ScaleRows(o, alpha);
        moved = true;
      }
      stamp_phase(tile, kMaxChecked);

      float base[2];
  #pragma unroll
      for (int h = 0; h < 2; ++h) {
        // A row that has seen nothing yet keeps max -inf; subtracting 0 then keeps exp2 finite.
        base[h] = row_max[h] == -INFINITY ? 0.f : row_max[h];
      }
      float sum[2] = {0.f, 0.f};
      // This warpgroup's P as wgmma A fragments: 16 tokens per k-step, accumulator column groups
      // 2k and 2k + 1 (rows g and g + 8 of the warp).
      uint32_t p_frag[2][4];
  #pragma unroll
      for (int i = 0; i < 4; ++i) {
  #pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float p0 = Exp2Ftz(s[4 * i + 2 * h] - base[h]);
          const float p1 = Exp2Ftz(s[4 * i + 2 * h + 1] - base[h]);
          sum[h] += p0 + p1;
          const int row = wrow + g + 8 * h;
          const uint32_t packed = mma::PackBf16x2(p0, p1);
          p_frag[i >> 1][(i & 1) * 2 + h] = packed;
          // P row `row`, tokens 32wg + 8i + 2c, +1: unit 4wg + i of the swizzled row, word c.
          StShared32(p_smem + SwizzledOffset(row, wg * 4 + i) + 4 * c, packed);
        }
      }
  #pragma unroll
      for (int h = 0; h < 2; ++h) row_sum[h] += sum[h];
      // O += P V in two halves of k: this warpgroup's own 32 tokens with P from registers, issued
      // before the barrier that brings the other warpgroup's 32 (so the barrier waits under tensor
      // work; v14, plans/0004), then those from shared memory. B = V read MN-major: rows = tokens,
      // n = dims 256wg .. 256wg+255 over chunks 4wg .. 4wg+3 (LBO = one chunk), SBO = 8 token rows.
      wgmma::PinRegisters(o);
      wgmma::Fence();
      const uint64_t v_desc =
          wgmma::MakeDescriptor(kv_tile + wg * 4 * kChunkBytes, kChunkBytes, 1024);
      if (kMath) {
  #pragma unroll
        for (int k = 0; k < 2; ++k) {
          wgmma::MmaM64N256K16RegATransB(o, p_frag[k],
                                         wgmma::AdvanceDescriptor(v_desc, (2 * wg + k) * 16 * 128));
        }
      }
      wgmma::Commit();
      stamp_phase(tile, kOwnPvIssued);
      wgmma::FenceProxyAsyncShared();
      // The other warpgroup's 32 columns of P are in shared memory; and whether any warp moved its
      // reference maximum.
      if (__syncthreads_or(moved)) {
        // Rare (each item's first tile; later only where a score jumps): both warpgroups take the
        // larger reference of each row. Own O and sums were built on row_max: rescale them (after
        // the own-token P V lands); the other's P on its reference: rescale it in place (only this
        // warpgroup reads it). Each warp fixes its own 16 rows.
        wgmma::WaitAll();
        wgmma::PinRegisters(o);
        float own_f[2], other_f[2];
  #pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float other = LdSharedF32(ref_max_at(1 - wg, h));
          const float common = fmaxf(row_max[h], other);
          own_f[h] = common == -INFINITY ? 1.f : Exp2Ftz(row_max[h] - common);
          other_f[h] = common == -INFINITY ? 1.f : Exp2Ftz(other - common);
          row_max[h] = common;
          row_sum[h] *= own_f[h];
        }
        ScaleRows(o, own_f);
  #pragma unroll
        for (int i = 0; i < 4; ++i) {
  #pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t addr =
                p_smem + SwizzledOffset(wrow + g + 8 * h, (1 - wg) * 4 + i) + 4 * c;
            const float2 pf = mma::UnpackBf16x2(LdShared32(addr));
            StShared32(addr, mma::PackBf16x2(pf.x * other_f[h], pf.y * other_f[h]));
          }
        }
        wgmma::FenceProxyAsyncShared();
        __syncthreads();  // every reference read; the rescaled P visible to the wgmma
  #pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (c == 0) StSharedF32(ref_max_at(wg, h), row_max[h]);
        }
      }
      wgmma::PinRegisters(o);
      wgmma::Fence();
      stamp_phase(tile, kPShared);
      const uint64_t p_desc = wgmma::MakeDescriptor(smem_base + kPOffset, 16, 1024);
      if (kMath) {
  #pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int kk = 2 * (1 - wg) + k;
          wgmma::MmaM64N256K16TransB(o, wgmma::AdvanceDescriptor(p_desc, kk * 32),
                                     wgmma::AdvanceDescriptor(v_desc, kk * 16 * 128));
        }
      }
      wgmma::Commit();
      wgmma::WaitAll();
      wgmma::PinRegisters(o);
      stamp_phase(tile, kPvDone);
      // The register A operand is read asynchronously: its registers stay unclaimed until here.
  #pragma unroll
      for (int k = 0; k < 2; ++k) {
  #pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(p_frag[k][e])::"memory");
      }
    }
  };
  bool item_by_copy = false;
  if (kGathers && kv_map.usable && item.col_begin + 2 * kCols <= item.col_end) {
    item_by_copy = TileIsOneRun(next_lo, next_hi, lane, __shfl_sync(kFullMask, next_lo, 0));
  }
  if (item_by_copy) {
    run_tiles(std::true_type{});
  } else {
    run_tiles(std::false_type{});
  }

  if (kTimeline && threadIdx.x == 0) stamps[2 + kTimelineTiles] = clock64();
  CpAsyncWaitAll();  // the last tile's zero-filling gather, before the stages hold the epilogue
  // Row sums: this lane's quarter, then the quad, then both warpgroups (warpgroup 0 first, so every
  // run adds in the same order).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float x = row_sum[h];
    x += __shfl_xor_sync(kFullMask, x, 1);
    x += __shfl_xor_sync(kFullMask, x, 2);
    if (c == 0) StSharedF32(sum_xchg + 4 * (wg * kRows + wrow + g + 8 * h), x);
  }
  __syncthreads();

  // The LSE of each row (one writer per row), and the row's 1/sum for the O scaling below.
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wrow + g + 8 * h;
    const float total = LdSharedF32(sum_xchg + 4 * r) + LdSharedF32(sum_xchg + 4 * (kRows + r));
    inv[h] = total > 0.f ? 1.f / total : 0.f;
    if (r < rows_here && wg == 0 && c == 0) {
      flash::WriteLse(params, item, first_row, r, flash::RowLse(row_max[h], total));
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
