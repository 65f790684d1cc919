// The flash MLA tree-verify kernel, portable path: mma.sync, cp.async, at most 101,376 bytes of
// shared memory per block. This is the kernel sm_120 (RTX PRO 6000 Blackwell, the product's GPU)
// runs, and sm_80; on sm_90 it is measured against the mma.sync ceiling (SPEC §5). A template over
// the group schedule so that the benchmark can build the variants it compares from this same source
// (tools/bench/mla_verify_flash_portable_variants.cu); mla_verify_flash.cu instantiates the
// product's one alone.
//
// Math (SPEC §1). Rows r = node * H + head of one sequence; columns t = 0 .. L+Q-1 (prefix first,
// then tree nodes):
//   S[r, t] = scale * <q[r, 0:576], kv[slot(t), 0:576]>, -inf where node(r) cannot see t;
//   O[r, :] = softmax_t(S[r, :]) @ kv[slot(t), 0:512];   LSE[r] = ln sum_t exp(S[r, t]).
// Online softmax in fp32 in log2 units (scale folded with log2 e), 32 KV columns per tile. Each
// row's reference maximum moves lazily, only when a score passes it by more than kMaxSlackLog2
// (P <= 2^8): O is rescaled on the rare tile where a reference moves, not on every tile.
//
// Tiling. One CTA = one work item (split planner): 64 rows of one sequence x a column range. All 64
// rows share one read of each KV tile (the latent is read once per row block, not once per head).
// 8 warps in two groups of four; group g owns rows 32g .. 32g+31 for the whole item: its own S,
// softmax, P and O, so the groups never exchange softmax state and only share the KV ring.
// Within a group, warp w:
//   - S (32 rows x 32 columns, k = 576): m-tile mt = w & 1 (16 rows), k-half kh = w >> 1. Its Q A
//     fragments (latent dims 256 kh .. +256, 64 registers) stay in registers for the whole item,
//     loaded once from global memory; its 32 rope dims come from shared memory (two k-steps). The
//     two k-halves of an m-tile swap halves of their partial S through shared memory, and each
//     finishes 8 of the 16 rows: sum (k-half 0 first, so both round alike), mask, softmax.
//   - P V (32 rows x 512, k = 32): O[:, 128 w .. 128 w + 128) of the group's 32 rows, 128 fp32
//     accumulators per thread; P from shared memory, V read transposed from the ring.
// Why rows split between the groups rather than d_v: with d_v split, each group's S would need all
// 64 rows of Q (144 registers a thread beside O's 128) or Q in shared memory (72 KB, which does not
// fit beside the ring in 99 KB). With rows split, a group's S needs only its own 32 rows.
//
// Schedule (one group's tile j; the numbers are the kernel's phases below):
//   1. (kTurns) wait for this group's turn: S runs in turns, A(0) B(0) A(1) B(1) ..., so that one
//      group's softmax and P V run under the other's S on the tensor pipe of each sub-partition
//      (each holds one warp of either group).
//   2. wait for tile j's ring stage (its mbarrier); S partial; (kTurns) pass the turn.
//   3. swap partial halves with the pair partner (the pair's mbarrier).
//   4. mask, reference max, P = exp2(S - ref) to shared memory with the row's rescale factor.
//   5. the group's P is out (its mbarrier); O = O * alpha (only where a reference moved) + P V.
//   6. arrive on the stage's "empty" mbarrier; the loader group (1) refills it with tile j + 2 once
//      both groups are done with it.
// How a tile arrives: gathered through the slot table (page size 1) by the loader group's 128
// threads with 16-byte cp.async, each arriving on the stage's "full" mbarrier when its own copies
// land; columns past col_end are zero-filled so a masked column never multiplies garbage (0 * NaN)
// into O. Why no bulk tensor copy for one-run tiles (sm_90 and sm_120 have the engine): its box
// lands densely, so ldmatrix needs the 128-byte swizzle, whose per-lane XOR addresses cost ~9
// integer instructions per mma in the loop (v1, plans/0026); rows padded to 1168 bytes make every
// ldmatrix address a per-lane base plus an immediate, and the copy the same for every layout.
// Prologue: the loader group issues the first two tiles while group 0 copies Q's rope dims to
// shared memory and every thread loads its Q fragments from global memory, all at once. Epilogue: O
// / rowsum as bf16 (the output, or a split's partial for the combine) staged in the idle ring and
// written as whole rows with 16-byte coalesced stores; the LSE per row.
//
// Shared memory (SharedPlan below):
//   ring     2 stages x 32 rows x 1168 B (576 bf16 padded by 16 B: 8 consecutive rows at one
//            16-byte unit fall in 8 different bank groups)                           74,752 B
//   Q rope   64 rows x 144 B (64 bf16, padded likewise)                                9,216 B
//   S swap   4 pairs x 2 halves x 32 lanes x 8 floats                                  8,192 B
//   P        2 groups x 2 (double buffer) x 32 rows x 64 B, units swizzled by line     8,192 B
//   rescale factors 2 x 2 x 32 fp32                                                     512 B
//   the item's rarely used fields, 12 mbarriers                                           128 B
//   total 100,992 B of the 101,376 B sm_120 allows per block (the row sums and references of the
//   epilogue reuse the swap buffer).
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

namespace verifyd::flash_portable {

using flash::Exp2Ftz;
using flash::kFullMask;
using flash::kLog2e;
using flash::kRows;
using mma::SmemAddr;

// sm_120 (and sm_86/89) allow 99 KB of shared memory per block, static and dynamic together.
inline constexpr int kSmemLimit = 101376;
inline constexpr int kGroupRows = kRows / 2;
inline constexpr int kGroupThreads = kFlashThreads / 2;
inline constexpr int kUnitsPerRow = kKvDim / 8;          // 16-byte units of a KV row (72)
inline constexpr int kRingRowBytes = kKvDim * 2 + 16;    // 1168: 73 units, odd
inline constexpr int kRingBytes = 64 * kRingRowBytes;    // 64 KV rows in all: 2 x 32 or 4 x 16
inline constexpr int kRopeRowBytes = kRopeDim * 2 + 16;  // 144: 9 units, odd
inline constexpr int kLatentKSteps = kVDim / 32;         // 16-dim k-steps of a k-half's latent dims
inline constexpr int kRopeKSteps = kRopeDim / 32;        // and of its rope dims
inline constexpr float kMaxSlackLog2 = 8.f;
static_assert(kFlashThreads == 256 && kRows == 64, "two groups of four warps over 64 rows");

// The tile's geometry. At 32 columns S has four independent accumulator chains (n-tiles); at 16,
// two n-tiles with the k-steps alternating between two sets (the chains an mma.sync latency of
// ~30 clocks needs), which the end of S adds.
template <int kCols>
struct Tile {
  static_assert(kCols == 16 || kCols == 32, "a tile is one or two k-steps of P V");
  static constexpr int kStages = kRingBytes / (kCols * kRingRowBytes);
  static constexpr int kStageBytes = kCols * kRingRowBytes;
  static constexpr int kNt = kCols / 8;              // 8-column n-tiles of S
  static constexpr int kKk = kCols / 16;             // 16-column k-steps of P V
  static constexpr int kSets = kCols == 16 ? 2 : 1;  // accumulator sets of S
  static constexpr int kSwapFloats = 2 * kNt;        // what one warp hands its partner, per lane
  static constexpr int kSwapVecs = kSwapFloats / 4;
  static constexpr int kPRowBytes = kCols * 2;
  static constexpr int kPUnits = kCols / 8;          // 16-byte units of a P row
  static constexpr int kPRowsPerLine = 8 / kPUnits;  // P rows per 128-byte line
  static constexpr int kRowsPerLoaderWarp = kCols / 4;
};

template <int kCols>
struct SharedPlan {
  using T = Tile<kCols>;
  uint8_t ring[T::kStages][T::kStageBytes];
  uint8_t q_rope[kRows][kRopeRowBytes];
  union {
    float4 swap[4][2][T::kSwapVecs][32];  // [pair][giver's k-half][vector][lane]
    struct {
      float row_sum[kRows];  // the epilogue's, once every swap is done
      float row_ref[kRows];
    } rows;
  } x;
  uint8_t p[2][2][kGroupRows * T::kPRowBytes];  // [group][tile parity]
  float alpha[2][2][kGroupRows];                // [group][tile parity][row]
  // What the loop needs of its item only now and then (the masked tiles, the refills): read from
  // here at the point of use rather than held in registers across the loop.
  struct {
    const int32_t* slots;
    const uint64_t* mask_rows;
    int32_t prefix_len, col_end, words_per_row, pad;
  } item;
  // Every barrier inside the loop is an mbarrier (a release on arrival, an acquire on the wait),
  // not a named barrier: compute-sanitizer's racecheck follows mbarriers, and named barriers
  // over part of the block left it reporting thousands of false hazards (plans/0004, v50).
  uint64_t full[T::kStages];   // a stage's tile landed: the loader group's 128 arrivals
  uint64_t empty[T::kStages];  // both groups are done with a stage: all 256 threads
  uint64_t swap[4];            // a pair's partials are out: the pair's 64 arrivals
  uint64_t p_ready[2];         // a group's P and rescale factors are out: its 128 arrivals
  uint64_t turn[2];            // group g may issue S: the other group's 128 arrivals
};
template <int kCols>
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedPlan<kCols>));
static_assert(kSmemBytes<16> <= kSmemLimit && kSmemBytes<32> <= kSmemLimit,
              "sm_120 allows 101,376 bytes of shared memory per block");
static_assert(kRows * flash::kStageStride <= kRingBytes, "the staged O fits the idle ring");

// ---- Barriers (PTX; each form exists on sm_80). ----

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void MbarrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// This thread's arrival, made once every cp.async it issued so far has landed (.noinc: one of the
// arrivals the barrier expects).
__device__ __forceinline__ void CpAsyncArriveNoInc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits for the phase of `bar` with parity `parity` to complete; its copies are then visible.
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#else
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#endif
  } while (!done);
}
__device__ __forceinline__ void StShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ float LdSharedF32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float4 LdSharedF32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ void StSharedF32x4(uint32_t addr, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ void StSharedF32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
// Volatile shared loads: the value is read here, where it is used, and the compiler cannot hoist
// it into a register held across the loop (SharedPlan::item says why).
__device__ __forceinline__ int LdSharedVolatile(const int32_t& v) {
  int r;
  asm volatile("ld.volatile.shared.b32 %0, [%1];\n" : "=r"(r) : "r"(SmemAddr(&v)));
  return r;
}
template <typename T>
__device__ __forceinline__ const T* LdSharedVolatile(const T* const& v) {
  uint64_t r;
  asm volatile("ld.volatile.shared.b64 %0, [%1];\n" : "=l"(r) : "r"(SmemAddr(&v)));
  return reinterpret_cast<const T*>(r);
}

// ---- Layouts. ----

// A P buffer's byte offset of columns [8 u, 8 u + 8) of group row `row`: kPRowsPerLine rows to a
// 128-byte line, the unit swizzled by the line, so that 8 consecutive rows (an ldmatrix matrix, or
// one softmax store) hit 8 different bank groups.
template <int kCols>
__device__ __forceinline__ uint32_t PUnit(int row, int unit) {
  using T = Tile<kCols>;
  const int line = row / T::kPRowsPerLine;
  return line * 128 + (((row % T::kPRowsPerLine) * T::kPUnits + (unit ^ (line % T::kPUnits))) << 4);
}

// The slot of column col + lane (lanes < kCols), 0 past col_end.
template <int kCols>
__device__ __forceinline__ int SlotWord(const int32_t* slots, int col, int col_end, int lane) {
  return lane < kCols && col + lane < col_end ? slots[col + lane] : 0;
}

// ---- Phases. ----

// A thread's place: its group and warp in the group, the warp's S role (m-tile, k-half), the
// lane's quad coordinates, and its shared-memory offsets: every ldmatrix of the loop reads [one of
// these + the stage + an immediate].
struct Lane {
  int tid, lane, group, gw, mt, kh, g, c;
  uint32_t k_off;  // S's K fragments: token (lane & 7) + 8 (lane >> 4), dims 256 kh + 8 ((lane
                   // >> 3) & 1)
  uint32_t
      rope_off;    // Q's rope A fragments: row 16 mt + (lane & 15), rope dims 32 kh + 8 (lane >> 4)
  uint32_t v_off;  // P V's V fragments (transposed): token (lane & 7) + 8 ((lane >> 3) & 1), dims
                   // 128 gw + 8 (lane >> 4)
  __device__ __forceinline__ explicit Lane(int t)
      : tid(t),
        lane(t & 31),
        group(t >> 7),
        gw((t >> 5) & 3),
        mt((t >> 5) & 1),
        kh((t >> 6) & 1),
        g((t & 31) >> 2),
        c(t & 3) {
    k_off =
        ((lane & 7) + ((lane >> 4) << 3)) * kRingRowBytes + (((lane >> 3) & 1) << 4) + kh * kVDim;
    rope_off = (group * kGroupRows + mt * 16 + (lane & 15)) * kRopeRowBytes +
               ((kh * 4 + (lane >> 4)) << 4);
    v_off = ((lane & 7) + (((lane >> 3) & 1) << 3)) * kRingRowBytes + gw * 256 + ((lane >> 4) << 4);
  }
};

// The loader group gathers tile `tile` into its stage: warp w of the group takes rows 8w .. 8w+7,
// lane i the units i, i+32 and i+64 (< 72) of each row. `word`: the slot of column tile_col + lane
// (SlotWord). Every thread of the group arrives once on the stage's "full" barrier.
template <int kCols>
__device__ __forceinline__ void FillStage(SharedPlan<kCols>& sp, const bf16_bits* kv, int tile,
                                          int tile_col, int col_end, int word, const Lane& l) {
  using T = Tile<kCols>;
  constexpr int kRowsPerLoaderWarp = T::kRowsPerLoaderWarp;
  const int stage = tile % T::kStages;
  const uint32_t dst =
      SmemAddr(sp.ring[stage]) + l.gw * kRowsPerLoaderWarp * kRingRowBytes + l.lane * 16;
  // Not unrolled: the loader group holds O and Q's fragments here too, and 8 rows' addresses at
  // once pushed the sm_120 build past 255 registers.
#pragma unroll 1
  for (int rr = 0; rr < kRowsPerLoaderWarp; ++rr) {
    const int r = l.gw * kRowsPerLoaderWarp + rr;
    const int slot = __shfl_sync(kFullMask, word, r);
    const bool valid = tile_col + r < col_end;
    const bf16_bits* src = kv + (valid ? static_cast<int64_t>(slot) * kKvDim + l.lane * 8 : 0);
#pragma unroll
    for (int i = 0; i < (kUnitsPerRow + 31) / 32; ++i) {
      if (l.lane + 32 * i < kUnitsPerRow) {
        mma::CpAsync16(dst + rr * kRingRowBytes + i * 512, src + (valid ? i * 256 : 0), valid);
      }
    }
  }
  CpAsyncArriveNoInc(SmemAddr(&sp.full[stage]));
}

// Q's rope dims of the item's 64 rows into shared memory (group 0's 128 threads; rows past
// rows_here zero-filled), waited for here.
template <int kCols>
__device__ __forceinline__ void LoadQRope(SharedPlan<kCols>& sp, const bf16_bits* q,
                                          int64_t first_row, int rows_here, int gtid) {
#pragma unroll
  for (int i = 0; i < kRows * (kRopeDim / 8) / kGroupThreads; ++i) {
    const int idx = gtid + kGroupThreads * i;
    const int r = idx >> 3;
    const int u = idx & 7;
    const bool valid = r < rows_here;
    const bf16_bits* src = valid ? q + (first_row + r) * kKvDim + kVDim + u * 8 : q;
    mma::CpAsync16(SmemAddr(&sp.q_rope[r][u * 16]), src, valid);
  }
  mma::CpAsyncCommit();
  mma::CpAsyncWaitAll();
}

// This warp's register A fragments of S (rows m-tile mt of its group, its k-half's latent dims)
// straight from global memory: a0 row g dims 2c.., a1 row g+8, a2 row g dims 2c+8.., a3 row g+8
// (mma's layout).
__device__ __forceinline__ void LoadQFragments(uint32_t (&q_frag)[kLatentKSteps][4],
                                               const bf16_bits* q, int64_t first_row, int rows_here,
                                               const Lane& l) {
  const int r_lo = l.group * kGroupRows + l.mt * 16 + l.g;
  const int r_hi = r_lo + 8;
  const uint32_t* lo = reinterpret_cast<const uint32_t*>(q + (first_row + r_lo) * kKvDim);
  const uint32_t* hi = reinterpret_cast<const uint32_t*>(q + (first_row + r_hi) * kKvDim);
  const bool lo_ok = r_lo < rows_here;
  const bool hi_ok = r_hi < rows_here;
#pragma unroll
  for (int ks = 0; ks < kLatentKSteps; ++ks) {
    const int word = (l.kh * (kVDim / 2) + ks * 16 + 2 * l.c) / 2;
    q_frag[ks][0] = lo_ok ? __ldg(lo + word) : 0u;
    q_frag[ks][1] = hi_ok ? __ldg(hi + word) : 0u;
    q_frag[ks][2] = lo_ok ? __ldg(lo + word + 4) : 0u;
    q_frag[ks][3] = hi_ok ? __ldg(hi + word + 4) : 0u;
  }
}

// Phase 2: this warp's partial S (16 rows x kCols over its k-half's 256 latent dims, A from
// registers, and 32 rope dims, A from shared memory) from the tile at `stage`.
template <int kCols>
__device__ __forceinline__ void PartialS(float (&s)[Tile<kCols>::kNt][4],
                                         const uint32_t (&q_frag)[kLatentKSteps][4], uint32_t stage,
                                         uint32_t q_rope, const Lane& l) {
  using T = Tile<kCols>;
  float acc[T::kSets][T::kNt][4];
#pragma unroll
  for (int set = 0; set < T::kSets; ++set)
#pragma unroll
    for (int nt = 0; nt < T::kNt; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[set][nt][i] = 0.f;
  const uint32_t k_base = stage + l.k_off;
  const uint32_t rope_k_base = k_base - l.kh * kVDim + kVDim * 2 + l.kh * kRopeDim;
  const uint32_t rope_a_base = q_rope + l.rope_off;
#pragma unroll
  for (int ks = 0; ks < kLatentKSteps + kRopeKSteps; ++ks) {
    const bool rope = ks >= kLatentKSteps;
    uint32_t a[4];
    if (rope) {
      mma::LdMatrixX4(a, rope_a_base + (ks - kLatentKSteps) * 32);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = q_frag[rope ? 0 : ks][i];
    }
    const uint32_t addr = rope ? rope_k_base + (ks - kLatentKSteps) * 32 : k_base + ks * 32;
    float(&d)[T::kNt][4] = acc[ks % T::kSets];
#pragma unroll
    for (int np = 0; np < T::kNt / 2; ++np) {
      uint32_t b[4];
      mma::LdMatrixX4(b, addr + np * 16 * kRingRowBytes);
      mma::MmaBf16(d[2 * np], a, b[0], b[1]);
      mma::MmaBf16(d[2 * np + 1], a, b[2], b[3]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < T::kNt; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      s[nt][i] = T::kSets == 2 ? acc[0][nt][i] + acc[T::kSets - 1][nt][i] : acc[0][nt][i];
}

// Phase 3: the pair's swap. Warp kh keeps row g + 8 kh of its m-tile (accumulator values 2 kh,
// 2 kh + 1 of each n-tile) and hands the other row to its partner; returns the whole sums of the
// kept row, k-half 0's partial first.
template <int kCols>
__device__ __forceinline__ void SwapPartials(SharedPlan<kCols>& sp,
                                             const float (&s)[Tile<kCols>::kNt][4],
                                             float (&x)[Tile<kCols>::kSwapFloats], int tile,
                                             const Lane& l) {
  using T = Tile<kCols>;
  const int pair = l.group * 2 + l.mt;
#pragma unroll
  for (int v = 0; v < T::kSwapVecs; ++v) {
    // Vector v holds n-tiles 2v and 2v + 1, two values each.
    const int n0 = 2 * v;
    const int n1 = 2 * v + 1;
    StSharedF32x4(SmemAddr(&sp.x.swap[pair][l.kh][v][l.lane]),
                  l.kh == 0 ? make_float4(s[n0][2], s[n0][3], s[n1][2], s[n1][3])
                            : make_float4(s[n0][0], s[n0][1], s[n1][0], s[n1][1]));
  }
  MbarrierArrive(SmemAddr(&sp.swap[pair]));
  MbarrierWait(SmemAddr(&sp.swap[pair]), tile & 1);
#pragma unroll
  for (int v = 0; v < T::kSwapVecs; ++v) {
    const float4 o = LdSharedF32x4(SmemAddr(&sp.x.swap[pair][1 - l.kh][v][l.lane]));
    const float other[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int nt = 2 * v + (i >> 1);
      const int e = i & 1;
      const float own = l.kh == 0 ? s[nt][e] : s[nt][2 + e];
      x[4 * v + i] = l.kh == 0 ? own + other[i] : other[i] + own;
    }
  }
}

// A row's softmax state, held by the 4 lanes of its quad: the reference maximum (log2 units) and
// this lane's share of the row sum.
struct RowState {
  float ref = -INFINITY;
  float sum = 0.f;
};

// Phase 4: mask, move the reference where a score passed it by more than the slack, P = exp2(x -
// ref) to the group's P buffer for this tile, and the row's rescale factor (1 unless it moved).
// x[2 nt + e] is column tile_col + 8 nt + 2c + e of the kept row.
// visible_end = min(prefix_len, col_end): the tiles before it need no mask.
template <int kCols>
__device__ __forceinline__ void SoftmaxToP(SharedPlan<kCols>& sp,
                                           float (&x)[Tile<kCols>::kSwapFloats], RowState& st,
                                           int tile, int tile_col, int visible_end,
                                           float scale_log2, int my_node, const Lane& l) {
  using T = Tile<kCols>;
  constexpr int kSwapFloats = T::kSwapFloats;
#pragma unroll
  for (int e = 0; e < kSwapFloats; ++e) x[e] *= scale_log2;
  if (tile_col + kCols > visible_end) {
    const int prefix_len = LdSharedVolatile(sp.item.prefix_len);
    const int col_end = LdSharedVolatile(sp.item.col_end);
    const int words_per_row = LdSharedVolatile(sp.item.words_per_row);
    const uint64_t* mask_rows = LdSharedVolatile(sp.item.mask_rows);
#pragma unroll
    for (int e = 0; e < kSwapFloats; ++e) {
      const int t = tile_col + (e >> 1) * 8 + 2 * l.c + (e & 1);
      const bool visible =
          t < col_end &&
          (t < prefix_len ||
           (my_node >= 0 && ColumnVisible(mask_rows, words_per_row, prefix_len, my_node, t)));
      x[e] = visible ? x[e] : -INFINITY;
    }
  }
  float tile_max = -INFINITY;
#pragma unroll
  for (int e = 0; e < kSwapFloats; ++e) tile_max = fmaxf(tile_max, x[e]);
  tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
  float alpha = 1.f;
  if (tile_max > st.ref + kMaxSlackLog2) {  // the quad agrees: same maximum, same reference
    alpha = Exp2Ftz(st.ref - tile_max);     // 0 from -inf: nothing was accumulated yet
    st.sum *= alpha;
    st.ref = tile_max;
  }
  // A row that has seen nothing keeps -inf; its scores are -inf too, and exp2(-inf - 0) = 0.
  const float base = st.ref == -INFINITY ? 0.f : st.ref;
  const int row = l.mt * 16 + 8 * l.kh + l.g;
  const uint32_t p = SmemAddr(sp.p[l.group][tile & 1]) + 4 * l.c;
#pragma unroll
  for (int nt = 0; nt < T::kNt; ++nt) {
    const float p0 = Exp2Ftz(x[2 * nt] - base);
    const float p1 = Exp2Ftz(x[2 * nt + 1] - base);
    st.sum += p0 + p1;
    StShared32(p + PUnit<kCols>(row, nt), mma::PackBf16x2(p0, p1));
  }
  if (l.c == 0) StSharedF32(SmemAddr(&sp.alpha[l.group][tile & 1][row]), alpha);
}

// Phase 5: O = O * alpha + P V over this warp's 128 value dims of the group's 32 rows.
template <int kCols>
__device__ __forceinline__ void AccumulatePV(SharedPlan<kCols>& sp, float (&o)[2][16][4], int tile,
                                             uint32_t stage, const Lane& l) {
  using T = Tile<kCols>;
  float alpha[2][2];
  bool rescale = false;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      alpha[mt][hi] = LdSharedF32(SmemAddr(&sp.alpha[l.group][tile & 1][mt * 16 + l.g + 8 * hi]));
      rescale |= alpha[mt][hi] != 1.f;
    }
  if (__any_sync(kFullMask, rescale)) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        o[mt][nt][0] *= alpha[mt][0];
        o[mt][nt][1] *= alpha[mt][0];
        o[mt][nt][2] *= alpha[mt][1];
        o[mt][nt][3] *= alpha[mt][1];
      }
  }
  const uint32_t p = SmemAddr(sp.p[l.group][tile & 1]);
  const uint32_t v_base = stage + l.v_off;
#pragma unroll
  for (int kk = 0; kk < T::kKk; ++kk) {
    uint32_t pa[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      mma::LdMatrixX4(pa[mt], p + PUnit<kCols>(mt * 16 + (l.lane & 15), kk * 2 + (l.lane >> 4)));
    }
#pragma unroll
    for (int np = 0; np < 8; ++np) {
      uint32_t vb[4];
      mma::LdMatrixX4Trans(vb, v_base + kk * 16 * kRingRowBytes + np * 32);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma::MmaBf16(o[mt][2 * np], pa[mt], vb[0], vb[1]);
        mma::MmaBf16(o[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
      }
    }
  }
}

// The epilogue: the rows' sums and references meet in shared memory; once both groups are done
// with the ring, O / sum goes to it as bf16 rows and leaves as 16-byte coalesced stores; the LSE.
template <int kCols>
__device__ __forceinline__ void WriteOutputs(SharedPlan<kCols>& sp, const float (&o)[2][16][4],
                                             RowState st, const MlaVerifyParams& params,
                                             const FlashWorkItem& item, const flash::ItemRows& rows,
                                             const Lane& l) {
  st.sum += __shfl_xor_sync(kFullMask, st.sum, 1);
  st.sum += __shfl_xor_sync(kFullMask, st.sum, 2);
  __syncthreads();  // both groups are past their last tile: the ring and the swap buffer are free
  const int my_row = l.group * kGroupRows + l.mt * 16 + 8 * l.kh + l.g;
  if (l.c == 0) {
    sp.x.rows.row_sum[my_row] = st.sum;
    sp.x.rows.row_ref[my_row] = st.ref;
  }
  __syncthreads();
  const uint32_t stage = SmemAddr(sp.ring[0]);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int r = l.group * kGroupRows + mt * 16 + l.g + 8 * hi;
      const float sum = sp.x.rows.row_sum[r];
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        const int col = l.gw * 128 + nt * 8 + 2 * l.c;
        StShared32(stage + r * flash::kStageStride + col * 2,
                   mma::PackBf16x2(o[mt][nt][2 * hi] * inv, o[mt][nt][2 * hi + 1] * inv));
      }
    }
  __syncthreads();
  constexpr int kUnitsPerOutRow = flash::kOutRowBytes / 16;
  uint8_t* dst = flash::OutRows(params, item, rows.first_row);
  const uint8_t* staged = sp.ring[0];
  for (int idx = l.tid; idx < rows.rows_here * kUnitsPerOutRow; idx += kFlashThreads) {
    const int r = idx / kUnitsPerOutRow;
    const int u = idx % kUnitsPerOutRow;
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * flash::kOutRowBytes + u * 16) =
        *reinterpret_cast<const uint4*>(staged + r * flash::kStageStride + u * 16);
  }
  if (l.tid < rows.rows_here) {
    flash::WriteLse(params, item, rows.first_row, l.tid,
                    flash::RowLse(sp.x.rows.row_ref[l.tid], sp.x.rows.row_sum[l.tid]));
  }
}

// What an instantiation adds to the kernel. kNone is the product; the others are the benchmark's
// instruments (plans/0026): kNoRefill never refills the ring (tiles after the first two are stale:
// the time of the math and the barriers alone, garbage output), kPrefetchL2 also brings tile j + 4
// into the L2 when it refills tile j + 2 (same output).
enum class PortableProbe { kNone, kNoRefill, kPrefetchL2 };

template <int kCols, bool kTurns, PortableProbe kProbe = PortableProbe::kNone>
__global__ void __launch_bounds__(kFlashThreads, 1)
    MlaVerifyFlashPortableKernel(MlaVerifyParams params) {
  using T = Tile<kCols>;
  constexpr int kStages = T::kStages;
  pdl::AllowDependentLaunch();  // the combine may be scheduled early (programmatic_launch.cuh)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  SharedPlan<kCols>& sp = *reinterpret_cast<SharedPlan<kCols>*>(smem_raw);
  const Lane l(threadIdx.x);
  const bool loader = l.group == 1;
  const VerifyProblem& pr = params.problem;
  const FlashWorkItem item = params.work[blockIdx.x];
  const flash::ItemRows rows = flash::DecodeItem(pr, item);
  const int num_tiles = (item.col_end - item.col_begin + kCols - 1) / kCols;

  // Prologue: the ring's barriers; the first tiles, Q's rope dims and Q's fragments at once.
  if (l.tid == 0) {
    sp.item.slots = rows.slots;
    sp.item.mask_rows = rows.mask_rows;
    sp.item.prefix_len = rows.prefix_len;
    sp.item.col_end = item.col_end;
    sp.item.words_per_row = rows.words_per_row;
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarrierInit(SmemAddr(&sp.full[s]), kGroupThreads);
      MbarrierInit(SmemAddr(&sp.empty[s]), kFlashThreads);
    }
#pragma unroll
    for (int p = 0; p < 4; ++p) MbarrierInit(SmemAddr(&sp.swap[p]), 64);
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      MbarrierInit(SmemAddr(&sp.p_ready[g]), kGroupThreads);
      MbarrierInit(SmemAddr(&sp.turn[g]), kGroupThreads);
    }
  }
  __syncthreads();
  int refill_word = 0;  // the loader's slot word of the tile its next refill brings
  if (loader) {
    for (int t = 0; t < kStages && t < num_tiles; ++t) {
      const int col = item.col_begin + t * kCols;
      FillStage(sp, pr.kv, t, col, item.col_end,
                SlotWord<kCols>(rows.slots, col, item.col_end, l.lane), l);
    }
    refill_word =
        SlotWord<kCols>(rows.slots, item.col_begin + kStages * kCols, item.col_end, l.lane);
  } else {
    LoadQRope(sp, pr.q, rows.first_row, rows.rows_here, l.tid);
  }
  uint32_t q_frag[kLatentKSteps][4];
  LoadQFragments(q_frag, pr.q, rows.first_row, rows.rows_here, l);
  __syncthreads();  // Q's rope dims are in

  float o[2][16][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mt][nt][i] = 0.f;
  RowState st;
  const int my_row = item.row_begin + l.group * kGroupRows + l.mt * 16 + 8 * l.kh + l.g;
  const int my_node = my_row < rows.seq_rows ? my_row / rows.heads : -1;
  const float scale_log2 = pr.scale * kLog2e;
  const int visible_end = min(rows.prefix_len, item.col_end);
  const int col_begin = item.col_begin;
  const uint32_t ring = SmemAddr(sp.ring[0]);
  const uint32_t q_rope = SmemAddr(sp.q_rope[0]);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage_index = tile % kStages;
    const uint32_t parity = (tile / kStages) & 1;
    const uint32_t stage = ring + stage_index * T::kStageBytes;
    const int tile_col = col_begin + tile * kCols;
    // 1-2: this group's turn, the tile, S; the turn passes on.
    if constexpr (kTurns) {
      // Group 1's S(j) follows group 0's S(j) (phase j of turn[1]); group 0's S(j) follows group
      // 1's S(j - 1) (phase j - 1 of turn[0]).
      if (l.group == 1) {
        MbarrierWait(SmemAddr(&sp.turn[1]), tile & 1);
      } else if (tile > 0) {
        MbarrierWait(SmemAddr(&sp.turn[0]), (tile - 1) & 1);
      }
    }
    MbarrierWait(SmemAddr(&sp.full[stage_index]), parity);
    float s[T::kNt][4];
    PartialS<kCols>(s, q_frag, stage, q_rope, l);
    if constexpr (kTurns) {
      if (l.group == 0 || tile + 1 < num_tiles) {
        MbarrierArrive(SmemAddr(&sp.turn[1 - l.group]));
      }
    }
    // 3-4: whole scores of the kept row, its softmax, P.
    float x[T::kSwapFloats];
    SwapPartials(sp, s, x, tile, l);
    SoftmaxToP(sp, x, st, tile, tile_col, visible_end, scale_log2, my_node, l);
    MbarrierArrive(SmemAddr(&sp.p_ready[l.group]));
    MbarrierWait(SmemAddr(&sp.p_ready[l.group]), tile & 1);
    // 5: O.
    AccumulatePV(sp, o, tile, stage, l);
    // 6: the stage is free of this thread; the loader refills it once both groups are done.
    MbarrierArrive(SmemAddr(&sp.empty[stage_index]));
    if (loader) {
      const int next = tile + kStages;
      const int col_end = LdSharedVolatile(sp.item.col_end);
      if (next < num_tiles) {
        MbarrierWait(SmemAddr(&sp.empty[stage_index]), parity);
        if constexpr (kProbe == PortableProbe::kNoRefill) {
          MbarrierArrive(SmemAddr(&sp.full[stage_index]));
        } else {
          FillStage(sp, pr.kv, next, col_begin + next * kCols, col_end, refill_word, l);
        }
        if constexpr (kProbe == PortableProbe::kPrefetchL2) {
          // Row `lane` of tile next + 2, its 128-byte lines split over the group's 4 warps.
          const int word = SlotWord<kCols>(LdSharedVolatile(sp.item.slots),
                                           col_begin + (next + 2) * kCols, col_end, l.lane);
          if (next + 2 < num_tiles && l.lane < kCols) {
            const char* row =
                reinterpret_cast<const char*>(pr.kv + static_cast<int64_t>(word) * kKvDim);
            for (int line = l.gw; line < kKvDim * 2 / 128; line += 4) {
              asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + line * 128));
            }
          }
        }
      }
      refill_word = SlotWord<kCols>(LdSharedVolatile(sp.item.slots), col_begin + (next + 1) * kCols,
                                    col_end, l.lane);
    }
  }
  WriteOutputs(sp, o, st, params, item, rows, l);
}

// The host side of one instantiation: its symbol and its launch.
template <int kCols, bool kTurns, PortableProbe kProbe = PortableProbe::kNone>
struct PortableKernel {
  static const void* Symbol() {
    return reinterpret_cast<const void*>(&MlaVerifyFlashPortableKernel<kCols, kTurns, kProbe>);
  }
  static cudaError_t Launch(const MlaVerifyParams& params, cudaStream_t stream) {
    const cudaError_t set = cudaFuncSetAttribute(
        Symbol(), cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes<kCols>);
    if (set != cudaSuccess) return set;
    MlaVerifyFlashPortableKernel<kCols, kTurns, kProbe>
        <<<params.num_work, kFlashThreads, kSmemBytes<kCols>, stream>>>(params);
    return cudaGetLastError();
  }
};

}  // namespace verifyd::flash_portable
