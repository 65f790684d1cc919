// What both flash kernels (the portable one, mla_verify_flash.cu, and the sm_90a one,
// mla_verify_flash_sm90.cuh) share: the constants of the online softmax, the decoding of a work
// item into its sequence's rows and columns, the LSE of a finished row, and where a work item's
// rows go (the output when it covers every column, else its split partial). Device code only.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/mla_verify_params.h"
#include "verify/mla_dims.h"

namespace verifyd::flash {

// Rows of one work item (both kernels give each CTA 64 rows: every head and node in them shares
// each KV tile read).
inline constexpr int kRows = kFlashBlockRows;
// The softmax runs in log2 units: scale * log2(e) folded into S, exp2 instead of exp; the LSE goes
// back to natural log with ln 2.
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
inline constexpr unsigned kFullMask = 0xffffffffu;
// 2^x on the special-function unit with denormal results flushed to zero, for both kernels'
// softmax. exp2f compiles to the non-flushing form, which wraps each MUFU.EX2 in a range test and
// two multiplies; a probability below 2^-126 against a row maximum of 2^0 changes no bf16 output
// (plans/0004, v25: -1 to -2 % on the Hopper kernel).
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The epilogue stages O as bf16 rows (outputs and partials alike) in the idle KV buffers, padded by
// 32 bytes so the accumulator layouts' 8 rows per store instruction hit 8 different bank groups.
inline constexpr int kOutRowBytes = kVDim * 2;
inline constexpr int kStageStride = kOutRowBytes + 32;

// One work item's view of its sequence (FlashWorkItem: seq, 64 rows from row_begin, a column
// range). Rows r = node * H + head; columns t < prefix_len are the prefix, then the tree nodes.
struct ItemRows {
  int num_nodes;
  int prefix_len;
  int heads;
  int seq_rows;          // num_nodes * heads
  int rows_here;         // rows of this item that exist (the last row block may be short)
  int64_t first_row;     // the item's first row in the batch's [total_q * H] rows
  const int32_t* slots;  // the sequence's slot table, one slot per column
  const uint64_t* mask_rows;
  int words_per_row;  // 64-bit words of one node's mask row
};

__device__ __forceinline__ ItemRows DecodeItem(const VerifyProblem& pr, const FlashWorkItem& item) {
  ItemRows v;
  const int q_begin = pr.qo_indptr[item.seq];
  v.num_nodes = pr.qo_indptr[item.seq + 1] - q_begin;
  v.prefix_len = pr.prefix_len[item.seq];
  v.heads = pr.num_heads;
  v.seq_rows = v.num_nodes * v.heads;
  v.rows_here = min(kRows, v.seq_rows - item.row_begin);
  v.first_row = static_cast<int64_t>(q_begin) * v.heads + item.row_begin;
  v.slots = pr.slots + pr.slot_indptr[item.seq];
  v.mask_rows = pr.mask_bits + pr.mask_indptr[item.seq];
  v.words_per_row = (v.num_nodes + 63) / 64;
  return v;
}

// ln sum exp(S) of a row from its running max (log2 units) and its sum of exp2(S - max); -inf for
// a row that saw no column (weight 0 in the combine).
__device__ __forceinline__ float RowLse(float row_max, float sum) {
  return sum > 0.f ? (row_max + log2f(sum)) * kLn2 : -INFINITY;
}

// Row r's LSE: to the output (when the caller asked for it) or to the item's partial slot.
__device__ __forceinline__ void WriteLse(const MlaVerifyParams& params, const FlashWorkItem& item,
                                         int64_t first_row, int r, float lse) {
  if (item.partial < 0) {
    if (params.problem.lse != nullptr) params.problem.lse[first_row + r] = lse;
  } else {
    params.partial_lse[static_cast<int64_t>(item.partial) * kRows + r] = lse;
  }
}

// Where row 0 of the item's O goes (rows follow at kOutRowBytes): the output rows of an item that
// covers every column, else its partial slot (bf16 as well, normalised by its own sum).
__device__ __forceinline__ uint8_t* OutRows(const MlaVerifyParams& params,
                                            const FlashWorkItem& item, int64_t first_row) {
  return item.partial < 0
             ? reinterpret_cast<uint8_t*>(params.problem.out + first_row * kVDim)
             : reinterpret_cast<uint8_t*>(params.partial_o +
                                          static_cast<int64_t>(item.partial) * kRows * kVDim);
}

}  // namespace verifyd::flash
