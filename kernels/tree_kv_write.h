// Writes a Verify call's tree KV (one row per tree node, batch order) into the pool on the device.
//
// A bf16 pool's write rides in the slot scatter and value check's launch (TreeRowWriteArgs below)
// and takes each row's slot from the call's upload, since that launch is what fills the arena. An
// fp8 pool's write is a launch of its own after the check (its quantizer wants values inside the
// bound) and reads the slots from the call's device slot lists (slots + slot_indptr[b], after the
// sequence's L_b prefix entries): the slot mirror's arena holds [prefix | tree] per sequence.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "verify/bf16.h"

namespace verifyd {

// The bf16 write as blocks of another launch (the slot scatter's and value check's,
// LaunchSlotScatterAndFirstOutOfBound in kernels/value_bound_check.h), one node and its
// dependency gap fewer per call (plans/0031, change 4). Its slots come with the call's upload
// (`slots[r]` for tree row r, batch order), not from the arena that launch's scatter fills:
//   kv[slots[r]] = rows[r]   (576 bf16), r < total_q.
// A slot outside [0, num_slots) is skipped (the host checked every slot it uploaded; this keeps a
// bad entry from faulting the device). All null / zero: no write.
struct TreeRowWriteArgs {
  bf16_bits* kv = nullptr;
  int64_t num_slots = 0;
  const bf16_bits* rows = nullptr;
  int total_q = 0;
  const int32_t* slots = nullptr;
};

// An fp8 pool: for every sequence b < batch and node i < qo_indptr[b+1] - qo_indptr[b]:
//   kv[slots[slot_indptr[b] + prefix_len[b] + i]] = quantized rows[qo_indptr[b] + i]
// kv: one layer [num_slots][656] bytes (16-byte aligned), rows: [total_q][576] bf16, 16-byte
// aligned; the index arrays are device memory (the device problem's). Each bf16 row is quantized
// on the way in, byte for byte as QuantizeFp8Row (verify/kv_fp8_layout.h),
// one warp per node. The rows must already satisfy SPEC §1's bound (the callers' value checks run
// first); a slot outside [0, num_slots) is skipped (the host checked every slot it uploaded;
// this keeps a bad entry from faulting the device). Allocates nothing, never synchronizes
// (graph-capturable).
absl::Status LaunchTreeKvWriteFp8(uint8_t* kv, int64_t num_slots, const bf16_bits* rows,
                                  int total_q, int batch, const int32_t* qo_indptr,
                                  const int32_t* prefix_len, const int32_t* slot_indptr,
                                  const int32_t* slots, cudaStream_t stream);

}  // namespace verifyd
