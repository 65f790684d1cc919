// The device-side description of one batched verify launch: the problem (VerifyProblem, device
// pointers) plus the split plan and the workspace the plan's partial results live in.
//
// The plan is data, not code: the host planner (split_planner.h) decides the work items from the
// host-side shapes, the caller copies them into the workspace, and the kernels read them there. A
// launch therefore needs no host sync and no allocation, and a captured CUDA graph replays it as
// is.
#pragma once

#include <cstdint>

#include "verify/verify_problem.h"

namespace verifyd {

// Rows of one flash CTA: rows r = node * H + head of one sequence, so 64 rows share each KV tile.
inline constexpr int kFlashBlockRows = 64;
// KV columns per pipeline stage of the flash kernel (see mla_verify_flash.cu for the budget).
inline constexpr int kFlashBlockCols = 32;

// One flash CTA: rows [row_begin, row_begin + 64) of sequence `seq` (clipped to Q_b * H) against
// KV columns [col_begin, col_end) of its L_b + Q_b columns (prefix first, then tree nodes).
struct FlashWorkItem {
  int32_t seq;
  int32_t row_begin;
  int32_t col_begin;
  int32_t col_end;
  // -1: this item covers all columns and writes `out`/`lse` directly. Otherwise the index of its
  // partial slot: fp32 O [64][512] normalised by its own sum, and its LSE [64], in the workspace.
  int32_t partial;
};

// One combine CTA group: merges `num_splits` consecutive partials into rows [row_begin, +64) of
// `seq`.
struct CombineItem {
  int32_t seq;
  int32_t row_begin;
  int32_t partial_begin;
  int32_t num_splits;
};

// What the kernels receive. Every pointer is device memory.
struct MlaVerifyParams {
  VerifyProblem problem;
  const FlashWorkItem* work = nullptr;  // [num_work]
  int num_work = 0;
  const CombineItem* combine = nullptr;  // [num_combine]
  int num_combine = 0;
  // [num_partials][64][512], each split's O already divided by its own row sum. bf16 (the
  // output's type), as split-KV decode kernels commonly store them: half the epilogue's writes and
  // the combine's reads, one more rounding of ~2^-9 (plans/0004, v16).
  bf16_bits* partial_o = nullptr;
  float* partial_lse = nullptr;  // [num_partials][64], natural log, -inf where a row saw nothing
  int num_partials = 0;
  int max_splits = 0;  // the largest num_splits of a combine item (picks the combine's shape)
};

}  // namespace verifyd
