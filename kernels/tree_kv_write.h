// Writes a Verify call's tree KV (one row per tree node, batch order) into the pool on the device,
// reading each node's slot from the call's device slot lists (slots + slot_indptr[b], after the
// sequence's L_b prefix entries), not from a separate upload.
//
// Why from the slot lists: the co-located data plane's tree KV already lies in device memory (a
// scheduler's registered region), and the slot lists of the call are uploaded anyway (the slot
// mirror's arena holds [prefix | tree] per sequence). Reading them here keeps the call's one H2D
// copy the only upload, so its CUDA graph has the same nodes as a plain Verify's plus this one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "verify/bf16.h"

namespace verifyd {

// For every sequence b < batch and node i < qo_indptr[b+1] - qo_indptr[b]:
//   kv[slots[slot_indptr[b] + prefix_len[b] + i]] = rows[qo_indptr[b] + i]   (576 bf16)
// kv: one layer [num_slots][576]; rows: [total_q][576], 16-byte aligned; the index arrays are
// device memory (the device problem's). A slot outside [0, num_slots) is skipped (the host checked
// every slot it uploaded; this keeps a bad entry from faulting the device). Allocates nothing,
// never synchronizes (graph-capturable).
absl::Status LaunchTreeKvWrite(bf16_bits* kv, int64_t num_slots, const bf16_bits* rows, int total_q,
                               int batch, const int32_t* qo_indptr, const int32_t* prefix_len,
                               const int32_t* slot_indptr, const int32_t* slots,
                               cudaStream_t stream);

// The same into an fp8 pool: kv is one layer [num_slots][656] bytes (16-byte aligned) and each
// bf16 row is quantized on the way in, byte for byte as QuantizeFp8Row (verify/kv_fp8_layout.h),
// one warp per node. The rows must already satisfy SPEC §1's bound (the callers' value checks run
// first); the same skipping of bad slots, no allocation, no synchronization.
absl::Status LaunchTreeKvWriteFp8(uint8_t* kv, int64_t num_slots, const bf16_bits* rows,
                                  int total_q, int batch, const int32_t* qo_indptr,
                                  const int32_t* prefix_len, const int32_t* slot_indptr,
                                  const int32_t* slots, cudaStream_t stream);

}  // namespace verifyd
