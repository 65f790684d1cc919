// The Hopper flash kernel's device operations (mla_verify_flash_sm90.cuh composes them): the
// ring's copies and gathers, shared-window loads and stores, and the online softmax's pieces on
// one thread's accumulator rows. sm_90a only.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/mla_verify_flash_common.cuh"
#include "kernels/mla_verify_flash_sm90_plan.cuh"
#include "kernels/mla_verify_mma.cuh"
#include "kernels/tma_sm90.cuh"
#include "kernels/tree_visibility.cuh"
#include "kernels/wgmma_sm90.cuh"
#include "verify/mla_dims.h"

namespace verifyd::flash_sm90 {

using flash::Exp2Ftz;
using flash::kFullMask;
using mma::CpAsync16;
using wgmma::SwizzledOffset;

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
  return slot < 4 ? smem_base + kRingOffset + slot * kHalfBytes : smem_base + kQOffset;
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
// IssueOtherPv), O and sums rescaled; the other's P then adds in as it is. Per thread: O's rows are
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

}  // namespace verifyd::flash_sm90
