// Writes rows into an fp8 pool ([slot][656] bytes, verify/kv_fp8_layout.h) on the device: bf16 rows
// quantized on the way in (an Append's bf16 tokens, a Verify's tree KV, a registered device
// buffer), or rows already in the layout copied as they are. The tree-KV form, which reads each
// node's slot from the call's slot lists, is kernels/tree_kv_write.h's LaunchTreeKvWriteFp8.
//
// Like LaunchKvSlotWrite: a slot outside [0, num_slots) is skipped (the host checked every slot
// it uploaded; this keeps a bad entry from faulting the device); nothing is allocated and nothing
// synchronizes, so the launches can be captured into a graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "verify/bf16.h"

namespace verifyd {

// kv[slots[k]] = QuantizeFp8Row(rows[k]) for k < num_rows, byte for byte. kv: [num_slots][656]
// (16-byte aligned: a pool's layer, or the whole pool seen as one layer); rows: [num_rows][576]
// bf16, 16-byte aligned; slots: device [num_rows]. The rows must already satisfy SPEC §1's bound
// (the callers check them first); other values give deterministic but meaningless bytes.
absl::Status LaunchKvSlotWriteFp8(uint8_t* kv, int64_t num_slots, const bf16_bits* rows,
                                  const int32_t* slots, int num_rows, cudaStream_t stream);

// kv[slots[k]] = rows[k] for k < num_rows: 656-byte rows as they are (already checked:
// verify/kv_fp8_check.h). kv and rows 16-byte aligned.
absl::Status LaunchFp8RowSlotWrite(uint8_t* kv, int64_t num_slots, const uint8_t* rows,
                                   const int32_t* slots, int num_rows, cudaStream_t stream);

}  // namespace verifyd
