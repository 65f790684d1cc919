// Row-moving kernels of the device KV pool ([layer][slot][576] bf16): compaction's copy of every
// layer in one launch, and the gather that reads rows back. The slot-write kernel is in kernels/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/bf16.h"

namespace verifyd {

// For every layer l < num_layers and k < num_moves: pool[l][dst[k]] = pool[l][src[k]].
// src and dst are device arrays; the caller guarantees they are in range and disjoint (so the
// copies are independent and may run in any order).
absl::Status LaunchCopySlotsAllLayers(bf16_bits* pool, int num_layers, int64_t capacity,
                                      const int32_t* src, const int32_t* dst, int num_moves,
                                      cudaStream_t stream);

// out[k] = layer_rows[slots[k]] for k < num_rows (out: device [num_rows][576]).
absl::Status LaunchGatherRows(const bf16_bits* layer_rows, const int32_t* slots, int num_rows,
                              bf16_bits* out, cudaStream_t stream);

}  // namespace verifyd
