// Row-moving kernels of the device KV pool ([layer][slot][row_bytes]: 1152 for bf16 rows, 656 for
// fp8 ones, verify/kv_dtype.h): compaction's copy of every layer in one launch (by slot list, or by
// runs of consecutive slots), and the gather that reads rows back. They move bytes, whatever the
// dtype; row_bytes other than those two is INVALID_ARGUMENT. The slot writers are
// kernels/mla_verify_launch.h's (bf16) and kernels/kv_fp8_write.h (fp8).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "verify/slot_copy_check.h"

namespace verifyd {

// For every layer l < num_layers and k < num_moves: pool[l][dst[k]] = pool[l][src[k]].
// src and dst are device arrays; the caller guarantees they are in range and disjoint (so the
// copies are independent and may run in any order).
absl::Status LaunchCopySlotsAllLayers(void* pool, int row_bytes, int num_layers, int64_t capacity,
                                      const int32_t* src, const int32_t* dst, int num_moves,
                                      cudaStream_t stream);

// The run copy splits each run's bytes (per layer) into segments of this many 16-byte words, one
// warp per segment (8 words per lane in flight).
inline constexpr int kCopySegmentWords = 256;

// Fills the device run table, 4 int32 per run: {src_begin, dst_begin, length, first segment},
// where a run of L rows has ceil(L * row_bytes / 16 / kCopySegmentWords) segments. Returns the
// total segment count (int64: the caller bounds it). table: host [4 * runs.size()], 16-byte
// aligned.
int64_t PackCopyRunTable(absl::Span<const SlotRunCopy> runs, int row_bytes, int32_t* table);

// For every layer l < num_layers and run k: rows [src_begin, +length) of pool[l] go to
// [dst_begin, +length). run_table: device, from PackCopyRunTable with the same row_bytes (16-byte
// aligned). The caller guarantees the runs are in range and no destination meets another run's
// source or destination (SlotCopyCheck::CheckRuns), so the segments are independent and run in
// any order.
absl::Status LaunchCopyRunsAllLayers(void* pool, int row_bytes, int num_layers, int64_t capacity,
                                     const int32_t* run_table, int num_runs, int64_t num_segments,
                                     cudaStream_t stream);

// out[k] = layer_rows[slots[k]] for k < num_rows (out: device [num_rows][row_bytes]).
absl::Status LaunchGatherRows(const void* layer_rows, int row_bytes, const int32_t* slots,
                              int num_rows, void* out, cudaStream_t stream);

}  // namespace verifyd
